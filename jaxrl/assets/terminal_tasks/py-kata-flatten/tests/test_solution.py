from solution import flatten


def test_0():
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_1():
    assert flatten([]) == []


def test_2():
    assert flatten([[[]]]) == []


def test_3():
    assert flatten(['a', ['b'], [['c']]]) == ['a', 'b', 'c']
