//! Redis's glob-style patterns (KEYS, SCAN MATCH), byte for byte as
//! `stringmatchlen` reads them: `*` any run of bytes, `?` any one byte,
//! `[abc]`, `[^abc]` and `[a-z]` a class (a reversed range is read
//! forwards, `\` quotes inside it, an unclosed class runs to the end of
//! the pattern), `\x` the byte x.

/// Whether `text` matches `pattern`.
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    // Every token but `*` takes exactly one byte, so on a mismatch it is
    // enough to go back to the last `*` and let it take one byte more.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            while p < pattern.len() && pattern[p] == b'*' {
                p += 1;
            }
            if p == pattern.len() {
                return true;
            }
            star = Some((p, t));
            continue;
        }
        if let Some(next) = one(pattern, p, text[t]) {
            p = next;
            t += 1;
            continue;
        }
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Where the pattern goes on if its token at `p` takes byte `c`; `None`
/// if it does not (or the pattern is spent).
fn one(pattern: &[u8], p: usize, c: u8) -> Option<usize> {
    match *pattern.get(p)? {
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == c).then_some(p + 2),
        b'[' => class(pattern, p + 1, c),
        literal => (literal == c).then_some(p + 1),
    }
}

/// A class starting at `p` (just past `[`): where the pattern goes on
/// after its `]`, if `c` is in it.
fn class(pattern: &[u8], mut p: usize, c: u8) -> Option<usize> {
    let not = pattern.get(p) == Some(&b'^');
    if not {
        p += 1;
    }
    let mut hit = false;
    loop {
        match pattern.get(p) {
            // Unclosed: the class runs to the end of the pattern.
            None => break,
            Some(b']') => {
                p += 1;
                break;
            }
            Some(b'\\') if p + 1 < pattern.len() => {
                hit |= pattern[p + 1] == c;
                p += 2;
            }
            Some(&a) if pattern.get(p + 1) == Some(&b'-') && p + 2 < pattern.len() => {
                let b = pattern[p + 2];
                let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                hit |= (lo..=hi).contains(&c);
                p += 3;
            }
            Some(&a) => {
                hit |= a == c;
                p += 1;
            }
        }
    }
    (hit != not).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns_match_as_redis_reads_them() {
        let yes: &[(&str, &str)] = &[
            ("*", ""),
            ("*", "anything"),
            ("h?llo", "hello"),
            ("h*llo", "hllo"),
            ("h*llo", "heeeello"),
            ("h[ae]llo", "hallo"),
            ("h[^e]llo", "hallo"),
            ("h[a-b]llo", "hbllo"),
            ("h[b-a]llo", "hallo"),
            ("user:*:name", "user:42:name"),
            ("*a*b*c", "xxaxxbxxbxxc"),
            ("\\*", "*"),
            ("[\\]]", "]"),
            ("a[bc", "ab"),
            ("**x", "x"),
            ("a*", "a"),
        ];
        for (p, t) in yes {
            assert!(matches(p.as_bytes(), t.as_bytes()), "{p} should match {t}");
        }
        let no: &[(&str, &str)] = &[
            ("h?llo", "hllo"),
            ("h[ae]llo", "hillo"),
            ("h[^e]llo", "hello"),
            ("h[a-b]llo", "hcllo"),
            ("user:*:name", "user:42:email"),
            ("*a*b*c", "xxaxxbxxbxxcx"),
            ("\\*", "a"),
            ("abc", "ab"),
            ("ab", "abc"),
            ("", "a"),
        ];
        for (p, t) in no {
            assert!(!matches(p.as_bytes(), t.as_bytes()), "{p} should not match {t}");
        }
    }

    #[test]
    fn binary_keys_match_byte_for_byte() {
        assert!(matches(b"\x00*\xff", b"\x00\x01\x02\xff"));
        assert!(!matches(b"\x00?", b"\x00"));
    }
}
