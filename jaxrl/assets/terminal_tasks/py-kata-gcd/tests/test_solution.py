from solution import gcd


def test_0():
    assert gcd(12, 18) == 6


def test_1():
    assert gcd(7, 13) == 1


def test_2():
    assert gcd(0, 5) == 5


def test_3():
    assert gcd(0, 0) == 0


def test_4():
    assert gcd(100, 75) == 25
