from solution import merge_intervals


def test_0():
    assert merge_intervals([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]]


def test_1():
    assert merge_intervals([]) == []


def test_2():
    assert merge_intervals([[1, 2], [2, 3]]) == [[1, 3]]


def test_3():
    assert merge_intervals([[5, 6], [1, 2]]) == [[1, 2], [5, 6]]


def test_4():
    assert merge_intervals([[1, 10], [2, 3]]) == [[1, 10]]
