#!/usr/bin/env python3
"""Tests scripts/check-function-size.py on tests/scripts/check-function-size/src/fixture.cpp.

The fixture holds functions of exactly 120 lines (not reported) and 121 lines (reported), with
braces in strings, characters, comments, a raw string, a directive, a braced member initializer
and a default argument `= {}` that must not change the counts.
"""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, '..', '..', 'scripts', 'check-function-size.py')
FIXTURE = os.path.join(HERE, 'check-function-size')


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT, '--root', FIXTURE, *args],
                       capture_output=True, text=True, check=False)
    return p.returncode, p.stdout.splitlines(), p.stderr


class CheckFunctionSizeTest(unittest.TestCase):
    def test_reports_the_121_line_functions_and_not_the_120_line_ones(self):
        rc, out, _ = run('src')
        self.assertEqual(out, [
            'src/fixture.cpp:133: Over121 is 121 lines (limit 120)',
            'src/fixture.cpp:393: Widget::Widget is 121 lines (limit 120)',
            'src/fixture.cpp:516: kLongLambda is 121 lines (limit 120)',
        ])
        self.assertEqual(rc, 1)

    def test_nothing_over_a_higher_limit_exits_zero(self):
        rc, out, _ = run('--limit', '121', 'src')
        self.assertEqual((rc, out), (0, []))

    def test_a_missing_folder_is_a_usage_error(self):
        rc, out, err = run('no-such-folder')
        self.assertEqual((rc, out), (2, []))
        self.assertIn('no-such-folder', err)


if __name__ == '__main__':
    unittest.main()
