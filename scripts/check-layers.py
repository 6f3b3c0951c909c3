#!/usr/bin/env python3
"""Checks that no module includes one above it (DESIGN.md §2).

Floors, lowest first: common ← formats ← executables (k3prep, k3verify, k3run; none includes
another's sources). Inside k3run: kernels ← ops ← weights ← stream ← engine ← app; text (tokenizer,
chat text) includes no other k3run folder, and engine opens the tokenizer. Also: the per-ISA kernel
files (k3run/kernels/*_avx2.cpp, *_avx512.cpp, compiled with -mavx2/-mavx512f) include only
<immintrin.h>, <cstdint> and kernels_internal.h, since an inline function or template from any
other header could be emitted there with AVX code and picked by the linker for portable callers
(kernels_internal.h). Prints `path:line: rule` for each breach and exits 1 if there is any.
Usage: scripts/check-layers.py [ROOT]   (default: the repository this script is in)
"""
import os
import re
import sys

K3RUN_BELOW = {
    'kernels': set(),
    'ops': {'kernels'},
    'weights': {'kernels', 'ops'},
    'stream': {'kernels', 'ops', 'weights'},
    'text': set(),
    'grammar': set(),
    'vision': {'kernels', 'ops'},
    'engine': {'kernels', 'ops', 'weights', 'stream', 'text', 'grammar', 'vision'},
    'serve': {'kernels', 'ops', 'weights', 'stream', 'engine', 'text', 'grammar', 'vision'},
    'mpi': {'kernels', 'ops', 'weights', 'stream', 'engine', 'text', 'grammar', 'vision'},
    'app': {'kernels', 'ops', 'weights', 'stream', 'engine', 'text', 'grammar', 'serve', 'mpi',
            'vision'},
}
TOP_BELOW = {
    'common': set(),
    'formats': {'common'},
    'k3prep': {'common', 'formats'},
    'k3verify': {'common', 'formats'},
    'k3run': {'common', 'formats'},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ANY_INCLUDE = re.compile(r'^\s*#\s*include\s+([<"][^>"]+[>"])')
ISA_FILE = re.compile(r'^k3run/kernels/[^/]+_(avx2|avx512)\.cpp$')
ISA_INCLUDES = {'<immintrin.h>', '<cstdint>', '"k3run/kernels/kernels_internal.h"'}


def module_of(path):
    """('k3run', 'ops') for k3run/ops/x.h; ('formats', None) for formats/x.h; None otherwise."""
    parts = path.split('/')
    if parts[0] not in TOP_BELOW:
        return None
    sub = parts[1] if parts[0] == 'k3run' and len(parts) > 2 else None
    return parts[0], sub


def allowed(src, dst):
    if src[0] != dst[0]:
        return dst[0] in TOP_BELOW[src[0]]
    if src[0] != 'k3run' or src[1] == dst[1]:
        return True
    if src[1] is None or dst[1] is None:
        return False  # k3run/ has no files at its top level
    return dst[1] in K3RUN_BELOW.get(src[1], set())


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = []
    for top in TOP_BELOW:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(('.h', '.cpp')):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                src = module_of(path)
                if src[0] == 'k3run' and src[1] is None:
                    problems.append(f'{path}:1: k3run/ files live in its layer folders')
                    continue
                isa_file = ISA_FILE.match(path) is not None
                with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
                    for lineno, line in enumerate(f, 1):
                        any_m = ANY_INCLUDE.match(line)
                        if isa_file and any_m and any_m.group(1) not in ISA_INCLUDES:
                            problems.append(f'{path}:{lineno}: an ISA kernel file may include only '
                                            f'<immintrin.h>, <cstdint> and kernels_internal.h, '
                                            f'not {any_m.group(1)} (kernels_internal.h: why)')
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        dst = module_of(m.group(1))
                        if dst is not None and not allowed(src, dst):
                            where = '/'.join(x for x in src if x)
                            problems.append(f'{path}:{lineno}: {where} may not include '
                                            f'"{m.group(1)}" (a module above it or beside it)')
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
