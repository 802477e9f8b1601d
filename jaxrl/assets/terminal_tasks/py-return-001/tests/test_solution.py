from solution import offset


def test_returns_the_integer():
    assert offset() == 707
    assert type(offset()) is int
