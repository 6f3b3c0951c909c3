#!/usr/bin/env python3
"""The oracle of tests/k3run/grammar/json_schema_test.cpp: every generated output must be JSON
that validates against its schema under python3-jsonschema's Draft 2020-12 validator.

Usage: validate_outputs.py CASES.json
CASES.json is a list of {"name": ..., "schema": ..., "outputs": [text, ...]}. Prints one line per
invalid output and a summary; exits 0 when all are valid, 1 when any is not, 2 when jsonschema
cannot be imported (run with Debian's /usr/bin/python3 and python3-jsonschema).
"""
import json
import sys

try:
    import jsonschema
except ImportError:
    print('validate_outputs: python3-jsonschema is not installed')
    sys.exit(2)


def main():
    with open(sys.argv[1], encoding='utf-8') as f:
        cases = json.load(f)
    total = 0
    bad = 0
    for case in cases:
        schema = case['schema']
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(schema)
        for text in case['outputs']:
            total += 1
            try:
                value = json.loads(text)
            except ValueError as e:
                bad += 1
                print(f'{case["name"]}: not JSON ({e}): {text!r}')
                continue
            errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
            if errors:
                bad += 1
                where = '/'.join(str(p) for p in errors[0].path)
                print(f'{case["name"]}: invalid at /{where}: {errors[0].message}: {text!r}')
    print(f'validate_outputs: {total - bad} of {total} outputs valid ({len(cases)} schemas, '
          f'jsonschema {jsonschema.Draft202012Validator.__name__})')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
