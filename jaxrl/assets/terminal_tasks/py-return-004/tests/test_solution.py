from solution import offset


def test_returns_the_integer():
    assert offset() == 597
    assert type(offset()) is int
