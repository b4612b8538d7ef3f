#!/usr/bin/env python3
"""Checks the relative links of Markdown files: each [text](target) outside code resolves to a file
or folder of the tree, and a target's #anchor to a heading of that Markdown file (GitHub's anchors).

  link_check.py ROOT FILE.md...   (FILE relative to ROOT)

Prints one line per broken link, FILE:LINE: what is wrong, and exits 1 if there is any; 0 and a
count otherwise. Links with a scheme (https:, mailto:) are not followed: the tree is what is
checked, offline. It never writes anything."""
import os
import re
import sys

LINK = re.compile(r'!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
SCHEME = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*:')
FENCE = re.compile(r'^\s{0,3}(```|~~~)')


def prose_lines(path):
    """(line number, text) of the lines outside fenced and indented code, inline code removed."""
    fenced = None
    prev_blank = True
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip('\n')
            m = FENCE.match(line)
            if m:
                if fenced is None:
                    fenced = m.group(1)
                elif line.strip().startswith(fenced):
                    fenced = None
                continue
            if fenced is not None:
                continue
            if prev_blank and line.startswith('    ') and line.strip():
                continue  # an indented code block
            prev_blank = not line.strip()
            yield n, re.sub(r'(`+)(?:(?!\1).)*?\1', '', line)


def slug(heading):
    """GitHub's anchor of a heading's text: markup dropped, lower case, punctuation dropped."""
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)
    text = re.sub(r'[`*]', '', text).strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path):
    seen = {}
    out = set()
    fenced = None
    with open(path, encoding='utf-8') as f:
        for line in f:
            m = FENCE.match(line)
            if m:
                fenced = m.group(1) if fenced is None else (None if line.strip().startswith(fenced) else fenced)
                continue
            h = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
            if fenced is None and h:
                s = slug(h.group(1))
                k = seen.get(s, 0)
                seen[s] = k + 1
                out.add(s if k == 0 else '%s-%d' % (s, k))
    return out


def check(root, rel):
    path = os.path.join(root, rel)
    bad = []
    count = 0
    for n, text in prose_lines(path):
        for m in LINK.finditer(text):
            target = m.group(1)
            if SCHEME.match(target):
                continue
            count += 1
            file_part, _, anchor = target.partition('#')
            dest = path if not file_part else os.path.normpath(
                os.path.join(os.path.dirname(path), file_part))
            where = '%s:%d: link %r' % (rel, n, target)
            if not os.path.realpath(dest).startswith(os.path.realpath(root) + os.sep):
                bad.append('%s: leaves the tree' % where)
            elif not os.path.exists(dest):
                bad.append('%s: no file %s' % (where, os.path.relpath(dest, root)))
            elif anchor and not dest.endswith('.md'):
                bad.append('%s: an anchor into a file that is not Markdown' % where)
            elif anchor and anchor not in anchors(dest):
                bad.append('%s: no heading with anchor #%s in %s' %
                           (where, anchor, os.path.relpath(dest, root)))
    return count, bad


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    root = argv[1]
    total, bad = 0, []
    for rel in argv[2:]:
        c, b = check(root, rel)
        total += c
        bad += b
    for line in bad:
        print(line)
    if bad:
        print('%d broken link(s) of %d' % (len(bad), total))
        return 1
    print('ok: %d relative link(s) in %d file(s) resolve' % (total, len(argv) - 2))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
