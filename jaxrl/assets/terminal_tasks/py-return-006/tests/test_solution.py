from solution import limit


def test_returns_the_integer():
    assert limit() == 684
    assert type(limit()) is int
