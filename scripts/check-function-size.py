#!/usr/bin/env python3
"""Reports every C++ function definition longer than the limit (default 120 lines).

A function's length runs from the first line of its signature (return type, template header and
attributes included) to its closing brace, both counted. Lambdas, local classes and blocks are
part of the function that contains them; a lambda assigned at namespace or class scope
(`const auto kF = [](...) { ... };`) counts as a function of its own.

How it reads C++ without a compiler: comments, string literals (raw ones too), character
literals and preprocessor lines are blanked first, so braces inside them are not counted; digit
separators (1'000) are not character literals. Then braces are matched, and a `{` at namespace
or class scope opens a function body when the text before it is a signature (a top-level
parenthesis, no `=` outside it, not a class, namespace or enum head). Constructor initializer
lists with braced members (`: a_{1}, b_(2) {`) are followed. Known gap: code under `#if`/`#else`
is read on both sides, so braces unbalanced across the branches would confuse it.

Prints `path:line: Name is N lines (limit L)` for each function over the limit, sorted by path
and line, and exits 1 if there is any (0 otherwise; 2 on a usage error).
Usage: scripts/check-function-size.py [--root DIR] [--limit N] [FOLDER ...]
       FOLDERs are relative to the root (default: the repository this script is in) and default
       to: common formats k3prep k3verify k3run.
"""
import argparse
import os
import re
import sys

DEFAULT_FOLDERS = ['common', 'formats', 'k3prep', 'k3verify', 'k3run']
EXTENSIONS = ('.cpp', '.h')


def blank(text):
    """`text` with comments, literals and preprocessor lines replaced by spaces (newlines kept).

    String and character literals keep their quotes so that `extern "C"` still reads as one.
    """
    out = list(text)
    n = len(text)
    i = 0
    line_start = True  # only whitespace since the last newline

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != '\n':
                out[k] = ' '

    while i < n:
        c = text[i]
        if c == '\n':
            line_start = True
            i += 1
            continue
        if line_start and c == '#':
            # A directive runs to the end of the line, continued by a trailing backslash;
            # comments inside it end with it too (a /* */ spanning lines is rare enough here).
            j = i
            while j < n:
                if text[j] == '\n' and text[j - 1] != '\\':
                    break
                j += 1
            wipe(i, j)
            i = j
            continue
        if not c.isspace():
            line_start = False
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
            continue
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            wipe(i, j)
            i = j
            continue
        if c == '"':
            raw = re.search(r'(?:u8|[uUL])?R$', text[max(0, i - 3):i])
            if raw and (i - len(raw.group(0)) == 0 or not is_ident(text[i - len(raw.group(0)) - 1])):
                m = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
                if m:
                    end = text.find(')' + m.group(1) + '"', i + m.end())
                    end = n if end < 0 else end + len(m.group(1)) + 2
                    wipe(i + 1, end - 1)
                    i = end
                    continue
            j = skip_quoted(text, i, '"')
            wipe(i + 1, j - 1)
            i = j
            continue
        if c == "'":
            if is_digit_separator(text, i):
                i += 1
                continue
            j = skip_quoted(text, i, "'")
            wipe(i + 1, j - 1)
            i = j
            continue
        i += 1
    return ''.join(out)


def is_ident(c):
    return c.isalnum() or c == '_'


def is_digit_separator(text, i):
    """True when the quote at i sits inside a number literal (1'000'000, 0xFF'FF)."""
    j = i
    while j > 0 and (is_ident(text[j - 1]) or text[j - 1] == "'"):
        j -= 1
    return j < i and text[j].isdigit() and i + 1 < len(text) and is_ident(text[i + 1])


def skip_quoted(text, i, quote):
    """Index just past the literal opened at i (stops at a newline for a malformed literal)."""
    j = i + 1
    n = len(text)
    while j < n:
        if text[j] == '\\':
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        if text[j] == '\n':
            return j
        j += 1
    return n


def match_brace(code, i):
    """Index of the `}` that closes the `{` at i (len(code) - 1 when unbalanced)."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == '{':
            depth += 1
        elif code[j] == '}':
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


OPERATOR = re.compile(r'\boperator\s*(\(\s*\)|\[\s*\]|new\b(\s*\[\s*\])?|delete\b(\s*\[\s*\])?|'
                      r'""\s*_?\w+|[^\w\s(]+|[A-Za-z_][\w:<>\s*&]*?(?=\s*\())')
ACCESS = re.compile(r'^\s*(public|private|protected)\s*:(?!:)')
ATTRS = re.compile(r'\[\[.*?\]\]|\balignas\s*\([^()]*\)')
NAMESPACE_HEAD = re.compile(r'^\s*(inline\s+)?namespace\b|^\s*extern\s*""\s*$')
CLASS_HEAD = re.compile(r'^\s*(template\s*<.*>\s*)?(class|struct|union|enum)\b')
LAMBDA_HEAD = re.compile(r'=\s*\[[^\]]*\]\s*(\([^()]*(\([^()]*\)[^()]*)*\))?\s*'
                         r'(mutable|constexpr|noexcept|->[^=]*|\s)*$')


def top_level(header):
    """`header` with everything inside (), [] and <> replaced by spaces, and the operator
    names replaced by `operator_`, so that `=`, `:` and `(` can be looked for at the top."""
    header = OPERATOR.sub(lambda m: 'operator_' + ' ' * (len(m.group(0)) - 9), header)
    out = []
    depth = 0
    angle = 0
    for k, c in enumerate(header):
        if c in '([':
            depth += 1
            out.append(c if depth == 1 and angle == 0 else ' ')
            continue
        if c in ')]':
            depth -= 1
            out.append(c if depth == 0 and angle == 0 else ' ')
            continue
        if depth == 0 and c == '<' and k > 0 and (is_ident(header[k - 1].rstrip() or ' ') or
                                                  header[:k].rstrip().endswith(('template', '>'))):
            angle += 1
            out.append(' ')
            continue
        if depth == 0 and c == '>' and angle > 0 and header[k - 1] != '-':
            angle -= 1
            out.append(' ')
            continue
        out.append(c if depth == 0 and angle == 0 else ' ')
    return ''.join(out)


def classify(header):
    """'container', 'function', 'init-member' (a braced member initializer inside a
    constructor's initializer list) or 'other' for the text before a `{` at container scope."""
    h = ATTRS.sub(' ', header)
    h = ACCESS.sub(' ', h)
    if NAMESPACE_HEAD.match(h):
        return 'container'
    top = top_level(h)
    if CLASS_HEAD.match(h) and '(' not in top:
        return 'other' if re.match(r'^\s*(template\s*<.*>\s*)?enum\b', h) else 'container'
    if LAMBDA_HEAD.search(h):
        return 'function'
    if '(' not in top:
        return 'other'
    before_paren = top[:top.index('(')]
    if '=' in before_paren:
        return 'other'  # an initializer: int x = f(1) ... or a lambda handled above
    last_close = top.rfind(')')
    tail = top[last_close + 1:]
    init = re.search(r'(?<!:):(?!:)', tail)
    if init and re.search(r'[\w>]\s*$', tail):
        return 'init-member'
    if '=' in tail.replace('->', '  ') and not init:
        return 'other'
    return 'function'


def function_name(header):
    h = ATTRS.sub(' ', ACCESS.sub(' ', header))
    lam = re.search(r'([\w:]+)\s*(\[[^\]]*\])?\s*=\s*\[', h)
    if LAMBDA_HEAD.search(h) and lam:
        return lam.group(1)
    top = top_level(h)
    paren = top.index('(')
    m = re.search(r'(~?[A-Za-z_][\w]*(\s*::\s*~?[A-Za-z_]\w*)*)\s*$', top[:paren])
    if not m:
        return '(unnamed)'
    name = re.sub(r'\s+', '', h[m.start():paren].strip())
    if name.endswith('operator_') or 'operator' in h[m.start():paren]:
        op = OPERATOR.search(h)
        if op:
            prefix = name[:name.rfind('operator')] if 'operator' in name else ''
            name = prefix + re.sub(r'\s+', '', op.group(0)).replace('operator', 'operator', 1)
    return name


def functions(code):
    """(name, first line, last line) of each function defined in blanked source `code`."""
    found = []
    line_at = []  # line number of each offset, built lazily below
    line = 1
    for c in code:
        line_at.append(line)
        if c == '\n':
            line += 1
    line_at.append(line)

    def scan(begin, end):
        header_start = begin
        parens = 0  # ( and [ open since header_start: a { inside them is an argument
        i = begin
        while i < end:
            c = code[i]
            if c in '([':
                parens += 1
            elif c in ')]':
                parens = max(0, parens - 1)
            elif c == '{' and parens > 0:
                i = match_brace(code, i)  # `= {}`, `T{1}` or a lambda inside a signature
            elif c in ';}':
                header_start = i + 1
                parens = 0
            elif c == '{':
                header = code[header_start:i]
                kind = classify(header)
                close = match_brace(code, i)
                if kind == 'container':
                    scan(i + 1, close)
                    header_start = close + 1
                elif kind == 'init-member':
                    pass  # part of the constructor's header; its body brace comes later
                elif kind == 'function':
                    first = header_start + (len(header) - len(header.lstrip()))
                    first += len(ACCESS.match(code[first:i]).group(0)) if ACCESS.match(code[first:i]) else 0
                    while first < i and code[first].isspace():
                        first += 1
                    found.append((function_name(header), line_at[first], line_at[close]))
                    header_start = close + 1
                else:
                    header_start = close + 1
                if kind != 'init-member':
                    parens = 0
                i = close
            i += 1

    scan(0, len(code))
    return found


def main(argv):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description='Reports functions over the line limit.')
    parser.add_argument('--root', default=here, help='repository root (default: %(default)s)')
    parser.add_argument('--limit', type=int, default=120, help='most lines allowed (default 120)')
    parser.add_argument('folders', nargs='*', default=DEFAULT_FOLDERS)
    args = parser.parse_args(argv)
    problems = []
    for folder in args.folders:
        top = os.path.join(args.root, folder)
        if not os.path.isdir(top):
            print(f'{folder}: not a folder under {args.root}', file=sys.stderr)
            return 2
        for dirpath, dirnames, files in os.walk(top):
            dirnames.sort()
            for name in sorted(files):
                if not name.endswith(EXTENSIONS):
                    continue
                full = os.path.join(dirpath, name)
                path = os.path.relpath(full, args.root)
                with open(full, encoding='utf-8', errors='replace') as f:
                    code = blank(f.read())
                for fn, first, last in functions(code):
                    n = last - first + 1
                    if n > args.limit:
                        problems.append((path, first, f'{path}:{first}: {fn} is {n} lines '
                                                      f'(limit {args.limit})'))
    for _, _, text in sorted(problems):
        print(text)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
