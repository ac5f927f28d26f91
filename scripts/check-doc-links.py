#!/usr/bin/env python3
"""Every relative link of the repository's Markdown files resolves.

The README links into docs/, and the documents link to each other and to
protocol/PROTOCOL.md by section: a moved or renamed heading breaks them
silently. For each link outside code fences that is not a URL, the file (or
directory) must exist, and an anchor must be a heading of the target
(GitHub's rule: lower case, punctuation dropped, spaces to hyphens, a
repeated heading gets -1, -2, ...). Prints each broken link; exit 1 if any.
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r'\]\(([^)\s]+)\)')
HEADING = re.compile(r'^#{1,6} (.*)$')


def outside_fences(text):
    """(line number, line) of the lines outside ``` fences."""
    fence = False
    for n, line in enumerate(text.split('\n'), 1):
        if line.startswith('```'):
            fence = not fence
        elif not fence:
            yield n, line


def anchors(text):
    seen, out = {}, set()
    for _, line in outside_fences(text):
        m = HEADING.match(line)
        if not m:
            continue
        a = re.sub(r'[^\w\- ]', '', m.group(1).strip().lower()).replace(' ', '-')
        seen[a] = seen.get(a, -1) + 1
        out.add(a if seen[a] == 0 else f'{a}-{seen[a]}')
    return out


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    files = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard', '*.md'],
                           cwd=root, capture_output=True, text=True, check=True).stdout.split()
    known, broken = {}, 0
    for f in files:
        text = open(os.path.join(root, f), encoding='utf-8').read()
        for n, line in outside_fences(text):
            for target in LINK.findall(line):
                if '://' in target or target.startswith('mailto:'):
                    continue
                path, _, anchor = target.partition('#')
                dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                full = os.path.join(root, dest)
                if not os.path.exists(full):
                    print(f'{f}:{n}: no such file: {target}')
                    broken += 1
                elif anchor and dest.endswith('.md'):
                    if dest not in known:
                        known[dest] = anchors(open(full, encoding='utf-8').read())
                    if anchor not in known[dest]:
                        print(f'{f}:{n}: no such heading: {target}')
                        broken += 1
    print(f'check-doc-links: {broken} broken links in {len(files)} Markdown files')
    return 1 if broken else 0


if __name__ == '__main__':
    sys.exit(main())
