from solution import primes_up_to


def test_0():
    assert primes_up_to(10) == [2, 3, 5, 7]


def test_1():
    assert primes_up_to(1) == []


def test_2():
    assert primes_up_to(2) == [2]


def test_3():
    assert len(primes_up_to(100)) == 25


def test_4():
    assert primes_up_to(30)[-1] == 29
