from solution import score


def test_returns_the_integer():
    assert score() == 631
    assert type(score()) is int
