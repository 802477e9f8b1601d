from solution import word_frequencies


def test_0():
    assert word_frequencies('The cat. the hat!') == {'the': 2, 'cat': 1, 'hat': 1}


def test_1():
    assert word_frequencies('') == {}


def test_2():
    assert word_frequencies('a a a') == {'a': 3}


def test_3():
    assert word_frequencies('Hi! hi? HI.') == {'hi': 3}
