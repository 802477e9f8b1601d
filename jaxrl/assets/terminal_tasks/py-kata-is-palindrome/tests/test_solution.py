from solution import is_palindrome


def test_0():
    assert is_palindrome('A man, a plan, a canal: Panama') is True


def test_1():
    assert is_palindrome('abc') is False


def test_2():
    assert is_palindrome('') is True


def test_3():
    assert is_palindrome('No lemon, no melon') is True


def test_4():
    assert is_palindrome('12a21') is True


def test_5():
    assert is_palindrome('ab2a') is False
