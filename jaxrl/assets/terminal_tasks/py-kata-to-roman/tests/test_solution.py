from solution import to_roman


def test_0():
    assert to_roman(4) == 'IV'


def test_1():
    assert to_roman(1994) == 'MCMXCIV'


def test_2():
    assert to_roman(3999) == 'MMMCMXCIX'


def test_3():
    assert to_roman(58) == 'LVIII'


def test_4():
    assert to_roman(1) == 'I'
