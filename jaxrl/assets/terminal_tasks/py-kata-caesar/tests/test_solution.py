from solution import caesar_cipher


def test_0():
    assert caesar_cipher('Hello, World!', 3) == 'Khoor, Zruog!'


def test_1():
    assert caesar_cipher('abc', -1) == 'zab'


def test_2():
    assert caesar_cipher('xyz', 29) == 'abc'


def test_3():
    assert caesar_cipher('', 5) == ''


def test_4():
    assert caesar_cipher('Zz 9', 1) == 'Aa 9'
