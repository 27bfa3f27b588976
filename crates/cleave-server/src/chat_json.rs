//! The `tojson` filter of chat templates, as transformers defines it: not
//! Jinja's own (nor minijinja's), which escapes `<`, `>`, `&` and `'` for
//! HTML and writes `{"a":1}`, but Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)` with those four as its arguments, in that order.
//! Templates that describe tools to the model write them through it, and
//! the model was trained on what Python writes: `{"a": 1, "b": [1.0, 1e-05]}`.

use std::io::{self, Write};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use serde_json::ser::{Formatter, Serializer};

/// `value | tojson(ensure_ascii, indent, separators, sort_keys)`, each
/// argument by position or by name.
pub fn tojson(value: &Value, positional: &[Value], named: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if positional.len() > NAMES.len() {
        return Err(invalid(format!(
            "tojson takes at most {} arguments ({}), not {}",
            NAMES.len(),
            NAMES.join(", "),
            positional.len()
        )));
    }
    let mut args: [Option<Value>; 4] = Default::default();
    for (i, name) in NAMES.iter().enumerate() {
        let by_name: Option<Value> = named.get(name)?;
        args[i] = match (positional.get(i), by_name) {
            (Some(_), Some(_)) => return Err(invalid(format!("tojson got '{name}' twice"))),
            (given, by_name) => given.cloned().or(by_name).filter(|v| !v.is_none()),
        };
    }
    named.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = args;
    let indent = match indent {
        None => None,
        Some(text) if text.kind() == ValueKind::String => Some(text.to_string()),
        // Python repeats a space `indent` times: nothing for 0 or less.
        Some(n) => match i64::try_from(n.clone()) {
            Ok(n) => Some(" ".repeat(n.max(0) as usize)),
            Err(_) => return Err(invalid(format!("tojson's indent is {n}: not a number or a string"))),
        },
    };
    let (item, key) = match separators {
        Some(pair) => separators_of(&pair)?,
        // Python's defaults: no space at a line's end when indenting.
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let value = if sort_keys.is_some_and(|s| s.is_true()) {
        sorted(value)?
    } else {
        value.clone()
    };
    let formatter = PythonJson {
        indent,
        item,
        key,
        ensure_ascii: ensure_ascii.is_some_and(|e| e.is_true()),
        depth: 0,
        has_value: false,
    };
    let mut out = Vec::new();
    serde::Serialize::serialize(&value, &mut Serializer::with_formatter(&mut out, formatter))
        .map_err(|e| invalid(format!("tojson cannot write this value as JSON: {e}")))?;
    String::from_utf8(out)
        .map(Value::from_safe_string)
        .map_err(|_| invalid("tojson wrote invalid UTF-8".into()))
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, message)
}

/// `(item_separator, key_separator)`, as Python takes them.
fn separators_of(pair: &Value) -> Result<(String, String), Error> {
    let parts: Option<Vec<String>> = pair.try_iter().ok().map(|items| {
        items
            .filter(|v| v.kind() == ValueKind::String)
            .map(|v| v.to_string())
            .collect()
    });
    match parts.as_deref() {
        Some([item, key]) if pair.len() == Some(2) => Ok((item.clone(), key.clone())),
        _ => Err(invalid(format!(
            "tojson's separators are {pair}: not a pair of strings"
        ))),
    }
}

/// `value` with the keys of every map in it sorted.
fn sorted(value: &Value) -> Result<Value, Error> {
    match value.kind() {
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            keys.sort();
            keys.into_iter()
                .map(|key| {
                    let item = sorted(&value.get_item(&key)?)?;
                    Ok((key, item))
                })
                .collect()
        }
        ValueKind::Seq => value.try_iter()?.map(|item| sorted(&item)).collect(),
        _ => Ok(value.clone()),
    }
}

/// What Python's `json.dumps` writes, through serde_json.
struct PythonJson {
    /// Written once per level before each item; none: all on one line.
    indent: Option<String>,
    item: String,
    key: String,
    ensure_ascii: bool,
    depth: usize,
    /// Whether the innermost open array or object has an item yet.
    has_value: bool,
}

impl PythonJson {
    fn new_line<W: ?Sized + Write>(&self, writer: &mut W) -> io::Result<()> {
        if let Some(indent) = &self.indent {
            writer.write_all(b"\n")?;
            for _ in 0..self.depth {
                writer.write_all(indent.as_bytes())?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        writer.write_all(bracket)
    }

    fn close<W: ?Sized + Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.new_line(writer)?;
        }
        writer.write_all(bracket)
    }

    fn item<W: ?Sized + Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if !first {
            writer.write_all(self.item.as_bytes())?;
        }
        self.new_line(writer)
    }
}

impl Formatter for PythonJson {
    fn write_f64<W: ?Sized + Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        writer.write_all(python_repr(value).as_bytes())
    }

    fn write_string_fragment<W: ?Sized + Write>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()> {
        if !self.ensure_ascii {
            return writer.write_all(fragment.as_bytes());
        }
        // Control characters, quotes and backslashes never reach here:
        // serde_json escapes them as Python does (`\n`, `\u001f`, ...).
        for c in fragment.chars() {
            if (' '..='~').contains(&c) {
                writer.write_all(&[c as u8])?;
            } else {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    write!(writer, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }

    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open(writer, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.item(writer, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open(writer, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.item(writer, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(self.key.as_bytes())
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// Python's `repr` of a finite float (serde_json writes the others as
/// null): the shortest digits that read back as it, in positional
/// notation from 1e-4 to below 1e16 (always with a point), else as
/// `1.5e+16` or `1e-05`.
fn python_repr(value: f64) -> String {
    // Rust's shortest form, as `-1.2345e-7`.
    let shortest = format!("{value:e}");
    let (mantissa, exponent) = shortest.split_once('e').unwrap_or((&shortest, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    // Where the point goes, counted from the first digit.
    let point = exponent + 1;
    let body = if !(-3..=16).contains(&point) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        format!("{first}{fraction}e{exponent_sign}{:02}", exponent.abs())
    } else if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{whole}.{fraction}")
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_as_python_writes_them() {
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-4, "0.0001"),
            (1.5e-5, "1.5e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (123456789.125, "123456789.125"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
        ];
        for (value, python) in cases {
            assert_eq!(python_repr(value), python, "{value:e}");
        }
    }
}
