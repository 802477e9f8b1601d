from solution import level


def test_returns_the_integer():
    assert level() == 610
    assert type(level()) is int
