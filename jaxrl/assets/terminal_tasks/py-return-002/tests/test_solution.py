from solution import base_value


def test_returns_the_integer():
    assert base_value() == 108
    assert type(base_value()) is int
