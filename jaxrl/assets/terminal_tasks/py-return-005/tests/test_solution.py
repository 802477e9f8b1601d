from solution import total


def test_returns_the_integer():
    assert total() == 913
    assert type(total()) is int
