from solution import fizzbuzz


def test_0():
    assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']


def test_1():
    assert fizzbuzz(0) == []


def test_2():
    assert fizzbuzz(15)[-1] == 'FizzBuzz'


def test_3():
    assert fizzbuzz(15)[9] == 'Buzz'


def test_4():
    assert len(fizzbuzz(100)) == 100
