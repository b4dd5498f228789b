//! The located YAML tree: every node and every mapping key keeps its line and column, so that
//! errors found after deserialization (semantic checks) still point at the right place.
//!
//! Stage 0 of loading: text → [`Node`] (duplicate keys refused here, with both lines), then
//! profile merge on nodes, then [`Node::to_json`] → typed file model.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_saphyr::{DuplicateKeyPolicy, Spanned};

/// A line and a column, both 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) line: usize,
    pub(crate) column: usize,
}

impl Loc {
    fn from_saphyr(loc: serde_saphyr::Location) -> Option<Loc> {
        let (line, column) = (loc.line(), loc.column());
        if line == 0 {
            return None;
        }
        Some(Loc {
            line: usize::try_from(line).unwrap_or(usize::MAX),
            column: usize::try_from(column).unwrap_or(usize::MAX),
        })
    }
}

/// One segment of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A key path such as `models[0].pricing.tiers[1].above`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(pub(crate) Vec<Seg>);

impl KeyPath {
    pub(crate) fn root() -> KeyPath {
        KeyPath(Vec::new())
    }

    pub(crate) fn key(&self, key: &str) -> KeyPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_owned()));
        KeyPath(segs)
    }

    pub(crate) fn index(&self, index: usize) -> KeyPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        KeyPath(segs)
    }

    pub(crate) fn join(&self, other: &KeyPath) -> KeyPath {
        let mut segs = self.0.clone();
        segs.extend(other.0.iter().cloned());
        KeyPath(segs)
    }

    /// Parses `tools[0].tool` (also `(root)` and the empty string).
    pub(crate) fn parse(text: &str) -> KeyPath {
        let mut segs = Vec::new();
        if text == "(root)" {
            return KeyPath(segs);
        }
        for part in text.split('.').filter(|p| !p.is_empty()) {
            let (name, mut rest) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if !name.is_empty() {
                segs.push(Seg::Key(name.to_owned()));
            }
            while let Some(stripped) = rest.strip_prefix('[') {
                let Some(end) = stripped.find(']') else { break };
                match stripped[..end].parse::<usize>() {
                    Ok(i) => segs.push(Seg::Index(i)),
                    Err(_) => segs.push(Seg::Key(stripped[..end].to_owned())),
                }
                rest = &stripped[end + 1..];
            }
        }
        KeyPath(segs)
    }

    pub(crate) fn from_serde(path: &serde_path_to_error::Path) -> KeyPath {
        use serde_path_to_error::Segment;
        KeyPath(
            path.iter()
                .filter_map(|s| match s {
                    Segment::Seq { index } => Some(Seg::Index(*index)),
                    Segment::Map { key } => Some(Seg::Key(key.clone())),
                    Segment::Enum { variant } => Some(Seg::Key(variant.clone())),
                    Segment::Unknown => None,
                })
                .collect(),
        )
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(root)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if i == 0 => f.write_str(k)?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A YAML node with its location (absent for trees built from Rust values).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) kind: Kind,
    pub(crate) loc: Option<Loc>,
}

/// A mapping key with its location.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Key {
    pub(crate) name: String,
    pub(crate) loc: Option<Loc>,
}

/// The node's content.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

/// A YAML failure found while building the tree.
#[derive(Debug)]
pub(crate) enum ParseError {
    /// Syntax (or budget, or scalar) error reported by serde-saphyr.
    Syntax { message: String, loc: Option<Loc> },
    /// The same key twice in one mapping.
    Duplicate {
        path: KeyPath,
        key: String,
        first: Option<Loc>,
        second: Option<Loc>,
    },
}

/// Parses one YAML document into a located tree.
pub(crate) fn parse(text: &str) -> Result<Node, ParseError> {
    let options = serde_saphyr::options! {
        duplicate_keys: DuplicateKeyPolicy::PassThrough,
        with_snippet: false,
    };
    match serde_saphyr::from_str_with_options::<Node>(text, options) {
        Ok(node) => match find_duplicate(&node, &KeyPath::root()) {
            Some(dup) => Err(dup),
            None => Ok(node),
        },
        Err(err) => {
            let message = serde_saphyr::MessageFormatter::format_message(
                &serde_saphyr::DefaultMessageFormatter,
                err.without_snippet(),
            )
            .into_owned();
            Err(ParseError::Syntax {
                message,
                loc: err.location().and_then(Loc::from_saphyr),
            })
        }
    }
}

/// The first mapping (in document order) holding the same key twice.
fn find_duplicate(node: &Node, path: &KeyPath) -> Option<ParseError> {
    match &node.kind {
        Kind::Map(entries) => {
            for (i, (key, value)) in entries.iter().enumerate() {
                if let Some((first, _)) = entries[..i].iter().find(|(k, _)| k.name == key.name) {
                    return Some(ParseError::Duplicate {
                        path: path.key(&key.name),
                        key: key.name.clone(),
                        first: first.loc,
                        second: key.loc,
                    });
                }
                if let Some(dup) = find_duplicate(value, &path.key(&key.name)) {
                    return Some(dup);
                }
            }
            None
        }
        Kind::Seq(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| find_duplicate(item, &path.index(i))),
        _ => None,
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<KindDe>::deserialize(deserializer)?;
        Ok(Node {
            kind: spanned.value.0,
            loc: Loc::from_saphyr(spanned.defined),
        })
    }
}

/// The content of a node, deserialized with `deserialize_any`.
struct KindDe(Kind);

impl<'de> Deserialize<'de> for KindDe {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KindVisitor).map(KindDe)
    }
}

struct KindVisitor;

impl<'de> Visitor<'de> for KindVisitor {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Kind, E> {
        Ok(Kind::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Kind, E> {
        Ok(Kind::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Kind, E> {
        Ok(Kind::UInt(v))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Kind, E> {
        i64::try_from(v)
            .map(Kind::Int)
            .map_err(|_| E::custom(format!("integer {v} is out of range")))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Kind, E> {
        u64::try_from(v)
            .map(Kind::UInt)
            .map_err(|_| E::custom(format!("integer {v} is out of range")))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Kind, E> {
        Ok(Kind::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Kind, E> {
        Ok(Kind::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Kind, E> {
        Ok(Kind::Str(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Kind, E> {
        Ok(Kind::Str(String::from_utf8_lossy(v).into_owned()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Kind, E> {
        Ok(Kind::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Kind, E> {
        Ok(Kind::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Kind, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        let mut items = Vec::new();
        while let Some(node) = seq.next_element::<Node>()? {
            items.push(node);
        }
        Ok(Kind::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<KeyText>>()? {
            let key = Key {
                name: key.value.0,
                loc: Loc::from_saphyr(key.referenced),
            };
            let value = map.next_value::<Node>()?;
            entries.push((key, value));
        }
        Ok(Kind::Map(entries))
    }
}

/// A mapping key rendered as text (YAML allows non-string keys).
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar mapping key")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText, E> {
                Ok(KeyText(v.to_owned()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<KeyText, E> {
                Ok(KeyText("null".to_owned()))
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl Node {
    /// A node without location.
    pub(crate) fn bare(kind: Kind) -> Node {
        Node { kind, loc: None }
    }

    /// Builds a location-less tree from a JSON value (configurations built in Rust).
    pub(crate) fn from_json(value: &Value) -> Node {
        let kind = match value {
            Value::Null => Kind::Null,
            Value::Bool(b) => Kind::Bool(*b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    Kind::UInt(u)
                } else if let Some(i) = n.as_i64() {
                    Kind::Int(i)
                } else {
                    Kind::Float(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => Kind::Str(s.clone()),
            Value::Array(items) => Kind::Seq(items.iter().map(Node::from_json).collect()),
            Value::Object(map) => Kind::Map(
                map.iter()
                    .map(|(k, v)| {
                        (
                            Key {
                                name: k.clone(),
                                loc: None,
                            },
                            Node::from_json(v),
                        )
                    })
                    .collect(),
            ),
        };
        Node::bare(kind)
    }

    /// The JSON value of this tree (what the typed file model is deserialized from).
    pub(crate) fn to_json(&self) -> Value {
        match &self.kind {
            Kind::Null => Value::Null,
            Kind::Bool(b) => Value::Bool(*b),
            Kind::Int(i) => Value::from(*i),
            Kind::UInt(u) => Value::from(*u),
            Kind::Float(f) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            Kind::Str(s) => Value::String(s.clone()),
            Kind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            Kind::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.name.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The value under `key` in a mapping.
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        self.entry(key).map(|(_, v)| v)
    }

    /// The key and value under `key` in a mapping.
    pub(crate) fn entry(&self, key: &str) -> Option<(&Key, &Node)> {
        match &self.kind {
            Kind::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.name == key)
                .map(|(k, v)| (k, v)),
            _ => None,
        }
    }

    /// The location at `path`: the value's location, or the key's when `want_key`. When the
    /// path does not exist (a missing key, a default), the deepest existing ancestor's location.
    pub(crate) fn locate(&self, path: &KeyPath, want_key: bool) -> Option<Loc> {
        let mut node = self;
        let mut best = self.loc;
        let last = path.0.len().saturating_sub(1);
        for (i, seg) in path.0.iter().enumerate() {
            let next = match (seg, &node.kind) {
                (Seg::Key(k), Kind::Map(entries)) => {
                    let alias = KEY_ALIASES
                        .iter()
                        .find(|(name, _)| name == k)
                        .map(|(_, alias)| *alias);
                    let found = entries.iter().find(|(key, _)| &key.name == k).or_else(|| {
                        entries
                            .iter()
                            .find(|(key, _)| Some(key.name.as_str()) == alias)
                    });
                    match found {
                        Some((key, value)) => {
                            if i == last && want_key {
                                return key.loc.or(best);
                            }
                            Some(value)
                        }
                        None => None,
                    }
                }
                (Seg::Index(n), Kind::Seq(items)) => items.get(*n),
                _ => None,
            };
            match next {
                Some(n) => {
                    node = n;
                    best = n.loc.or(best);
                }
                None => return best,
            }
        }
        best
    }
}

/// Keys of the file model that accept an alias (`serde(alias)`): `(name, alias)`.
const KEY_ALIASES: [(&str, &str); 2] = [("tool", "python"), ("reasoning", "thinking")];

/// Deep-merges `over` into `base`: mappings key by key, everything else (lists, scalars)
/// replaced whole; values under `params` and `llm` are replaced whole too.
pub(crate) fn merge(base: &mut Node, over: &Node) {
    match (&mut base.kind, &over.kind) {
        (Kind::Map(base_entries), Kind::Map(over_entries)) => {
            for (key, value) in over_entries {
                let whole = key.name == "params" || key.name == "llm";
                match base_entries.iter_mut().find(|(k, _)| k.name == key.name) {
                    Some((_, existing)) if !whole => merge(existing, value),
                    Some((existing_key, existing)) => {
                        *existing_key = key.clone();
                        *existing = value.clone();
                    }
                    None => base_entries.push((key.clone(), value.clone())),
                }
            }
        }
        _ => *base = over.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn key_path_round_trip() {
        for text in [
            "tools[0].tool",
            "models[0].pricing.tiers[1].above",
            "a",
            "x[2][3].y",
        ] {
            assert_eq!(KeyPath::parse(text).to_string(), text);
        }
        assert_eq!(KeyPath::parse("(root)"), KeyPath::root());
        assert_eq!(KeyPath::root().to_string(), "(root)");
    }

    #[test]
    fn merge_maps_deep_lists_params_llm_whole() {
        let mut base = parse(
            "a:\n  k: 1\n  params: {x: 1, y: 2}\n  llm: {max_tokens: 5, params: {p: 1}}\n  list: [1, 2]\n",
        )
        .unwrap();
        let over =
            parse("a:\n  params: {x: 3}\n  llm: {params: {q: 2}}\n  list: [9]\n  new: true\n")
                .unwrap();
        merge(&mut base, &over);
        assert_eq!(
            base.to_json(),
            serde_json::json!({"a": {
                "k": 1,
                "params": {"x": 3},
                "llm": {"params": {"q": 2}},
                "list": [9],
                "new": true,
            }})
        );
        // Merged values keep the location they came from.
        let loc = base.locate(&KeyPath::parse("a.list[0]"), false).unwrap();
        assert_eq!((loc.line, loc.column), (4, 10));
    }

    #[test]
    fn locations_of_keys_and_values() {
        let node = parse("top:\n  inner: [a, {b: 1}]\n").unwrap();
        let v = node
            .locate(&KeyPath::parse("top.inner[1].b"), false)
            .unwrap();
        assert_eq!((v.line, v.column), (2, 18));
        let k = node
            .locate(&KeyPath::parse("top.inner[1].b"), true)
            .unwrap();
        assert_eq!((k.line, k.column), (2, 15));
        // Missing tail: nearest ancestor.
        let a = node
            .locate(&KeyPath::parse("top.missing.deep"), false)
            .unwrap();
        assert_eq!((a.line, a.column), (2, 3));
    }
}
