from solution import run_length_encode


def test_0():
    assert run_length_encode('aaabcc') == 'a3b1c2'


def test_1():
    assert run_length_encode('') == ''


def test_2():
    assert run_length_encode('a') == 'a1'


def test_3():
    assert run_length_encode('zzzzzzzzzzzz') == 'z12'


def test_4():
    assert run_length_encode('abab') == 'a1b1a1b1'
