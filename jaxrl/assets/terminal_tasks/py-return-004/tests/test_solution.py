from solution import magic_number


def test_returns_the_integer():
    assert magic_number() == 762
    assert type(magic_number()) is int
