from solution import total


def test_returns_the_integer():
    assert total() == 672
    assert type(total()) is int
