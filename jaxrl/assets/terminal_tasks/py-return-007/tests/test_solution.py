from solution import answer


def test_returns_the_integer():
    assert answer() == 123
    assert type(answer()) is int
