//! llama.cpp's GBNF grammars, read into llguidance's Lark dialect.
//!
//! GBNF (llama.cpp's grammars/README.md): `name ::= alternatives`, with
//! string literals, character classes (`[a-z]`, `[^"\\]`), `.` for any
//! character, groups, `|`, and the repeats `*`, `+`, `?`, `{m}`, `{m,}`,
//! `{m,n}`, `{,n}`; `#` comments; a rule ends at a newline outside
//! parentheses, except after `|` or `::=`; `root` is where it starts.
//! llguidance parses like Lark with a dynamic lexer (Earley over the text),
//! so a rule for rule translation accepts the same strings: each rule on
//! one line, literals as JSON strings, classes as regexes, `root` as
//! `start`.

use std::collections::HashMap;
use std::fmt::Write;

/// Most a repeat may count (`x{m,n}`): a bound far past any real grammar
/// keeps a typo from building a huge automaton.
const MAX_REPEAT: u32 = 10_000;

/// The Lark grammar that accepts what `gbnf` does, or what in it is not
/// GBNF (with the line it is on).
pub fn to_lark(gbnf: &str) -> Result<String, String> {
    let rules = Reader::new(gbnf).rules()?;
    if !rules.iter().any(|(name, _)| name == "root") {
        return Err("the grammar has no 'root' rule, where GBNF starts".into());
    }
    let names = lark_names(rules.iter().map(|(name, _)| name.as_str()));
    let mut lark = String::new();
    for (name, body) in &rules {
        let body = body.replace_names(&names)?;
        let _ = writeln!(lark, "{}: {}", names[name], body);
    }
    Ok(lark)
}

/// Each GBNF rule name's Lark one: `root` is `start`; a name Lark takes as
/// a rule (lowercase, a letter first) is kept; others get a numbered name,
/// so that `Value` and `value` stay apart.
fn lark_names<'a>(names: impl Iterator<Item = &'a str>) -> HashMap<String, String> {
    let is_lark_rule = |n: &str| {
        n.starts_with(|c: char| c.is_ascii_lowercase())
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    };
    names
        .enumerate()
        .map(|(i, n)| {
            let lark = match n {
                "root" => "start".to_string(),
                n if is_lark_rule(n) && n != "start" && !n.starts_with("gbnf") => n.to_string(),
                n => format!(
                    "gbnf{i}-{}",
                    n.to_ascii_lowercase()
                        .replace(|c: char| !c.is_ascii_alphanumeric(), "-")
                ),
            };
            (n.to_string(), lark)
        })
        .collect()
}

/// A rule's body, written in Lark but for the rule names it refers to.
struct Body {
    parts: Vec<Part>,
}

enum Part {
    Lark(String),
    /// A rule name, and the line it is on.
    Name(String, usize),
}

impl Body {
    fn replace_names(&self, names: &HashMap<String, String>) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Lark(s) => out.push_str(s),
                Part::Name(n, line) => match names.get(n) {
                    Some(lark) => out.push_str(lark),
                    None => return Err(format!("line {line}: rule '{n}' is used but never defined")),
                },
            }
        }
        Ok(out)
    }
}

struct Reader<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Self {
        Reader {
            chars: text.chars().peekable(),
            line: 1,
        }
    }

    fn error<T>(&self, what: impl std::fmt::Display) -> Result<T, String> {
        Err(format!("line {}: {what}", self.line))
    }

    fn next(&mut self) -> Option<char> {
        let c = self.chars.next();
        if c == Some('\n') {
            self.line += 1;
        }
        c
    }

    /// Skips spaces and comments, and newlines where `newlines` (inside
    /// parentheses, or after `|` and `::=`).
    fn skip_space(&mut self, newlines: bool) {
        while let Some(&c) = self.chars.peek() {
            match c {
                ' ' | '\t' | '\r' => {}
                '\n' if newlines => {}
                '#' => {
                    while self.chars.peek().is_some_and(|&c| c != '\n') {
                        self.next();
                    }
                    continue;
                }
                _ => return,
            }
            self.next();
        }
    }

    fn name(&mut self) -> String {
        let mut name = String::new();
        while let Some(&c) = self.chars.peek() {
            if !(c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                break;
            }
            name.push(c);
            self.next();
        }
        name
    }

    fn rules(mut self) -> Result<Vec<(String, Body)>, String> {
        let mut rules: Vec<(String, Body)> = Vec::new();
        loop {
            self.skip_space(true);
            if self.chars.peek().is_none() {
                return Ok(rules);
            }
            let name = self.name();
            if name.is_empty() {
                let found = self.chars.peek().copied().unwrap_or(' ');
                return self.error(format!("expected a rule name, found '{found}'"));
            }
            self.skip_space(false);
            if !(self.next() == Some(':') && self.next() == Some(':') && self.next() == Some('=')) {
                return self.error(format!("expected '::=' after rule name '{name}'"));
            }
            if rules.iter().any(|(n, _)| *n == name) {
                return self.error(format!("rule '{name}' is defined twice"));
            }
            self.skip_space(true);
            let mut body = Body { parts: Vec::new() };
            self.alternatives(&mut body, false)?;
            match self.next() {
                None | Some('\n') => rules.push((name, body)),
                Some(c) => return self.error(format!("unexpected '{c}' in rule '{name}'")),
            }
        }
    }

    /// `seq | seq | ...`, up to the end of the rule (or of the group, when
    /// `nested`).
    fn alternatives(&mut self, body: &mut Body, nested: bool) -> Result<(), String> {
        self.sequence(body, nested)?;
        while self.chars.peek() == Some(&'|') {
            self.next();
            body.parts.push(Part::Lark(" | ".into()));
            self.skip_space(true);
            self.sequence(body, nested)?;
        }
        Ok(())
    }

    fn sequence(&mut self, body: &mut Body, nested: bool) -> Result<(), String> {
        let mut items = 0;
        loop {
            self.skip_space(nested);
            let Some(&c) = self.chars.peek() else { break };
            let starts_item = matches!(c, '"' | '[' | '.' | '(' | '-' | '_') || c.is_ascii_alphanumeric();
            if starts_item && items > 0 {
                body.parts.push(Part::Lark(" ".into()));
            }
            match c {
                '"' => {
                    self.next();
                    let text = self.literal()?;
                    body.parts.push(Part::Lark(lark_string(&text)));
                }
                '[' => {
                    self.next();
                    let class = self.class()?;
                    body.parts.push(Part::Lark(class));
                }
                '.' => {
                    self.next();
                    body.parts.push(Part::Lark("/(?s:.)/".into()));
                }
                '(' => {
                    self.next();
                    body.parts.push(Part::Lark("(".into()));
                    self.skip_space(true);
                    self.alternatives(body, true)?;
                    self.skip_space(true);
                    if self.next() != Some(')') {
                        return self.error("a '(' is never closed");
                    }
                    body.parts.push(Part::Lark(")".into()));
                }
                '*' | '+' | '?' if items > 0 => {
                    self.next();
                    body.parts.push(Part::Lark(c.to_string()));
                    continue;
                }
                '{' if items > 0 => {
                    self.next();
                    let repeat = self.repeat()?;
                    body.parts.push(Part::Lark(repeat));
                    continue;
                }
                c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                    let line = self.line;
                    let name = self.name();
                    body.parts.push(Part::Name(name, line));
                }
                '<' | '!' => return self.error("token references (<[id]>, <|name|>, !) are not supported"),
                '*' | '+' | '?' | '{' => return self.error(format!("'{c}' repeats nothing")),
                _ => break,
            }
            items += 1;
        }
        if items == 0 {
            return self.error("an alternative is empty: write \"\" for the empty string");
        }
        Ok(())
    }

    /// A string literal's text, after its opening quote.
    fn literal(&mut self) -> Result<String, String> {
        let mut text = String::new();
        loop {
            match self.next() {
                None | Some('\n') => return self.error("a string literal is never closed"),
                Some('"') => return Ok(text),
                Some('\\') => text.push(self.escape()?),
                Some(c) => text.push(c),
            }
        }
    }

    /// The character an escape stands for, after its backslash.
    fn escape(&mut self) -> Result<char, String> {
        let hex = |reader: &mut Self, digits: usize| -> Result<char, String> {
            let code: String = (0..digits).filter_map(|_| reader.next()).collect();
            u32::from_str_radix(&code, 16)
                .ok()
                .filter(|_| code.len() == digits)
                .and_then(char::from_u32)
                .map_or_else(
                    || reader.error(format!("'{code}' is not {digits} hex digits of a character")),
                    Ok,
                )
        };
        match self.next() {
            Some('x') => hex(self, 2),
            Some('u') => hex(self, 4),
            Some('U') => hex(self, 8),
            Some('t') => Ok('\t'),
            Some('r') => Ok('\r'),
            Some('n') => Ok('\n'),
            Some(c @ ('\\' | '"' | '[' | ']' | '-' | '^')) => Ok(c),
            Some(c) => self.error(format!("unknown escape '\\{c}'")),
            None => self.error("the grammar ends inside an escape"),
        }
    }

    /// A character class as a Lark regex, after its `[`: every character
    /// written as `\x{..}`, so that nothing in it is read as regex syntax.
    fn class(&mut self) -> Result<String, String> {
        let mut regex = String::from("/[");
        if self.chars.peek() == Some(&'^') {
            self.next();
            regex.push('^');
        }
        let mut members = 0;
        loop {
            let first = match self.next() {
                None => return self.error("a '[' is never closed"),
                Some(']') if members > 0 => break,
                Some(']') => return self.error("a character class is empty"),
                Some('\\') => self.escape()?,
                Some(c) => c,
            };
            let _ = write!(regex, "\\x{{{:x}}}", first as u32);
            members += 1;
            let mut ahead = self.chars.clone();
            if ahead.next() == Some('-') && ahead.next().is_some_and(|c| c != ']') {
                self.next();
                let last = match self.next() {
                    Some('\\') => self.escape()?,
                    Some(c) => c,
                    None => return self.error("a '[' is never closed"),
                };
                if last < first {
                    return self.error(format!("the range {first:?}-{last:?} is backwards"));
                }
                let _ = write!(regex, "-\\x{{{:x}}}", last as u32);
            }
        }
        regex.push_str("]/");
        Ok(regex)
    }

    /// `{m}`, `{m,}`, `{m,n}` or `{,n}`, after its `{`, as Lark writes it.
    fn repeat(&mut self) -> Result<String, String> {
        let mut spec = String::new();
        loop {
            match self.next() {
                Some('}') => break,
                Some(c) if c.is_ascii_digit() || c == ',' || c == ' ' => spec.push(c),
                _ => return self.error("a repeat is written {m}, {m,}, {m,n} or {,n}"),
            }
        }
        let spec: String = spec.chars().filter(|c| *c != ' ').collect();
        let bound = |s: &str| -> Result<Option<u32>, String> {
            match s {
                "" => Ok(None),
                s => match s.parse::<u32>() {
                    Ok(n) if n <= MAX_REPEAT => Ok(Some(n)),
                    _ => self.error(format!("repeat count {s} is over {MAX_REPEAT}")),
                },
            }
        };
        let (low, high) = match spec.split_once(',') {
            Some((low, high)) => (bound(low)?, bound(high)?),
            None => {
                let n = bound(&spec)?.map_or_else(|| self.error("a repeat {} has no count"), Ok)?;
                (Some(n), Some(n))
            }
        };
        if let (Some(low), Some(high)) = (low, high) {
            if low > high {
                return self.error(format!("the repeat {{{low},{high}}} counts down"));
            }
        }
        Ok(match (low, high) {
            (Some(l), Some(h)) if l == h && !spec.contains(',') => format!("{{{l}}}"),
            (l, h) => format!(
                "{{{},{}}}",
                l.unwrap_or(0),
                h.map_or_else(String::new, |h| h.to_string())
            ),
        })
    }
}

/// `text` as a Lark (JSON) string literal.
fn lark_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_become_lark_lines() {
        let gbnf = r#"
# answers
root   ::= answer ("," ws answer)*   # a list
answer ::= "yes" | "no" |
           Maybe
Maybe  ::= [a-zA-Z_\-]{2,5} [^"\\\n]? .
ws     ::= [ \t]*
"#;
        let lark = to_lark(gbnf).unwrap();
        let lines: Vec<&str> = lark.lines().collect();
        assert_eq!(lines[0], r#"start: answer ("," ws answer)*"#);
        assert_eq!(lines[1], r#"answer: "yes" | "no" | gbnf2-maybe"#);
        assert_eq!(
            lines[2],
            r#"gbnf2-maybe: /[\x{61}-\x{7a}\x{41}-\x{5a}\x{5f}\x{2d}]/{2,5} /[^\x{22}\x{5c}\x{a}]/? /(?s:.)/"#
        );
        assert_eq!(lines[3], r#"ws: /[\x{20}\x{9}]/*"#);
    }

    #[test]
    fn what_is_not_gbnf_is_named_with_its_line() {
        let err = |g: &str| to_lark(g).unwrap_err();
        assert_eq!(
            err("answer ::= \"a\"\n"),
            "the grammar has no 'root' rule, where GBNF starts"
        );
        assert_eq!(err("root ::= a\n"), "line 1: rule 'a' is used but never defined");
        assert_eq!(
            err("root ::= \"a\"\nroot ::= \"b\""),
            "line 2: rule 'root' is defined twice"
        );
        assert!(err("root ::= (\"a\"\n").contains("never closed"));
        assert!(err("root ::= \"a\nb\"").contains("a string literal is never closed"));
        assert!(err("root ::= [z-a]").contains("backwards"));
        assert!(err("root ::= \"a\"{99999}").contains("over 10000"));
        assert!(err("root ::= \"a\"{3,1}").contains("counts down"));
        assert!(err("root ::= <[42]>").contains("token references"));
        assert!(err("root := \"a\"").contains("expected '::='"));
        assert!(err("root ::= \"\\q\"").contains("unknown escape"));
        assert!(err("root ::= | \"a\"").contains("empty"));
    }

    #[test]
    fn escapes_and_unicode_reach_the_lark_literal() {
        let lark = to_lark(r#"root ::= "\x41\u00e9\U0001F600\t\"" [\u00e0-\u00ff]"#).unwrap();
        assert_eq!(lark, "start: \"Aé😀\\t\\\"\" /[\\x{e0}-\\x{ff}]/\n");
    }
}
