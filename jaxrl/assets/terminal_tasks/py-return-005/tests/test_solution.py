from solution import compute


def test_returns_the_integer():
    assert compute() == 443
    assert type(compute()) is int
