//! Canonical JSON (keys sorted, compact, UTF-8) written straight from a `Serialize` value,
//! without building its `serde_json::Value` tree first.
//!
//! An object's entries are written in the order they come, each as `"key":value`; when the
//! object closes, they are put in key order by moving their bytes (nested objects are already
//! in order by then). Keys compare as `String::cmp` does, on their bytes. Whatever this writer
//! does not render exactly as `serde_json::to_value` then a sorted write would (a map key
//! neither a string nor an integer, or optional, an integer beyond 64 bits, a key given twice,
//! holding an escape or left without its value, a custom serializer error), it refuses with
//! [`Unsupported`], and the caller falls back on that slower path: the bytes are the same
//! either way.

use std::fmt;

use serde::{
    Serialize,
    ser::{self, Serializer as _},
};

/// Something this writer does not render exactly as the `Value` path would.
#[derive(Debug)]
pub(super) struct Unsupported;

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not written in canonical form directly")
    }
}

impl std::error::Error for Unsupported {}

impl ser::Error for Unsupported {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Unsupported
    }
}

/// One `"key":value` entry of an object, by its byte offsets in the output.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    /// The opening quote of the key.
    pub(super) start: usize,
    /// Just after the key's closing quote.
    pub(super) key_end: usize,
    /// Just after the value.
    pub(super) end: usize,
}

impl Entry {
    /// The key as written: a JSON string, quotes included.
    pub(super) fn key<'a>(&self, out: &'a [u8]) -> &'a [u8] {
        &out[self.start..self.key_end]
    }

    /// The value as written.
    pub(super) fn value<'a>(&self, out: &'a [u8]) -> &'a [u8] {
        &out[self.key_end + 1..self.end]
    }
}

/// Canonical JSON of `value`, and the entries of its top-level object in key order (empty
/// when it is not an object).
pub(super) fn to_canonical<T: Serialize + ?Sized>(
    value: &T,
) -> Result<(Vec<u8>, Vec<Entry>), Unsupported> {
    let mut writer = Canonical::default();
    value.serialize(&mut writer)?;
    Ok((writer.out, writer.top))
}

#[derive(Default)]
struct Canonical {
    out: Vec<u8>,
    /// Where an object's entries are put in order before going back to `out`.
    scratch: Vec<u8>,
    /// Entry lists of closed objects, kept for the next ones.
    pool: Vec<Vec<Entry>>,
    /// Objects and arrays open around the value being written.
    depth: usize,
    /// The top-level object's entries, in order, once it is closed.
    top: Vec<Entry>,
    /// A map key is being written (an optional key is refused, as `serde_json` refuses it).
    in_key: bool,
}

impl Canonical {
    fn string(&mut self, text: &str) -> Result<(), Unsupported> {
        serde_json::Serializer::new(&mut self.out)
            .serialize_str(text)
            .map_err(|_| Unsupported)
    }

    fn open_object(&mut self) -> Object<'_> {
        self.out.push(b'{');
        let entries = self.pool.pop().unwrap_or_default();
        let start = self.out.len();
        self.depth += 1;
        Object {
            writer: self,
            start,
            entries,
        }
    }

    fn open_array(&mut self) -> Array<'_> {
        self.out.push(b'[');
        self.depth += 1;
        Array {
            writer: self,
            first: true,
        }
    }

    /// `{"variant":`, for the externally tagged variants; [`Canonical::close_variant`] ends it.
    fn open_variant(&mut self, variant: &str) -> Result<(), Unsupported> {
        self.out.push(b'{');
        self.string(variant)?;
        self.out.push(b':');
        self.depth += 1;
        Ok(())
    }

    fn close_variant(&mut self) {
        self.depth -= 1;
        self.out.push(b'}');
    }
}

/// An object being written.
struct Object<'a> {
    writer: &'a mut Canonical,
    /// Just after the `{`.
    start: usize,
    entries: Vec<Entry>,
}

impl<'a> Object<'a> {
    /// Writes `"key":` for a key already known to be a string.
    fn str_key(&mut self, key: &str) -> Result<(), Unsupported> {
        self.comma()?;
        let start = self.writer.out.len();
        self.writer.string(key)?;
        self.key_written(start)
    }

    /// Writes `"key":` for a map key: a string, or an integer written as one.
    fn any_key<K: Serialize + ?Sized>(&mut self, key: &K) -> Result<(), Unsupported> {
        self.comma()?;
        let start = self.writer.out.len();
        self.writer.in_key = true;
        let key = key.serialize(&mut *self.writer);
        self.writer.in_key = false;
        key?;
        let written = &self.writer.out[start..];
        if written.first() != Some(&b'"') {
            let integer = written
                .strip_prefix(b"-")
                .unwrap_or(written)
                .iter()
                .all(u8::is_ascii_digit);
            if written.is_empty() || !integer {
                return Err(Unsupported);
            }
            self.writer.out.insert(start, b'"');
            self.writer.out.push(b'"');
        }
        self.key_written(start)
    }

    /// The comma before an entry after the first; a key left without its value (a
    /// serializer's mistake the `Value` path would drop silently) is refused.
    fn comma(&mut self) -> Result<(), Unsupported> {
        match self.entries.last() {
            None => {}
            Some(entry) if entry.end == 0 => return Err(Unsupported),
            Some(_) => self.writer.out.push(b','),
        }
        Ok(())
    }

    /// Records the key written from `start`. A key holding an escape is refused: keys sort
    /// by their text, and that one's differs from its bytes.
    fn key_written(&mut self, start: usize) -> Result<(), Unsupported> {
        let key_end = self.writer.out.len();
        if self.writer.out[start..key_end].contains(&b'\\') {
            return Err(Unsupported);
        }
        self.writer.out.push(b':');
        self.entries.push(Entry {
            start,
            key_end,
            end: 0,
        });
        Ok(())
    }

    fn value<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<(), Unsupported> {
        value.serialize(&mut *self.writer)?;
        if let Some(entry) = self.entries.last_mut() {
            entry.end = self.writer.out.len();
        }
        Ok(())
    }

    /// Puts the entries in key order and writes the closing `}`.
    fn close(mut self) -> Result<&'a mut Canonical, Unsupported> {
        if self.entries.last().is_some_and(|entry| entry.end == 0) {
            return Err(Unsupported);
        }
        let out = &self.writer.out;
        // Keys hold no escape (see `key_written`): between its quotes, a key is its text.
        let key = |entry: &Entry| {
            let quoted = entry.key(out);
            &quoted[1..quoted.len() - 1]
        };
        if !self.entries.is_sorted_by(|a, b| key(a) < key(b)) {
            self.entries.sort_unstable_by(|a, b| key(a).cmp(key(b)));
            // The `Value` path keeps one entry of a key given twice.
            if self
                .entries
                .windows(2)
                .any(|pair| key(&pair[0]) == key(&pair[1]))
            {
                return Err(Unsupported);
            }
            let scratch = &mut self.writer.scratch;
            scratch.clear();
            for (i, entry) in self.entries.iter_mut().enumerate() {
                if i > 0 {
                    scratch.push(b',');
                }
                let at = self.start + scratch.len();
                scratch.extend_from_slice(&out[entry.start..entry.end]);
                let shift = |offset: usize| offset - entry.start + at;
                *entry = Entry {
                    start: at,
                    key_end: shift(entry.key_end),
                    end: shift(entry.end),
                };
            }
            let writer = &mut *self.writer;
            writer.out.truncate(self.start);
            writer.out.extend_from_slice(&writer.scratch);
        }
        let writer = &mut *self.writer;
        writer.out.push(b'}');
        writer.depth -= 1;
        let mut entries = std::mem::take(&mut self.entries);
        if writer.depth == 0 {
            std::mem::swap(&mut writer.top, &mut entries);
        }
        entries.clear();
        writer.pool.push(entries);
        Ok(self.writer)
    }
}

/// An array being written.
struct Array<'a> {
    writer: &'a mut Canonical,
    first: bool,
}

impl<'a> Array<'a> {
    fn element<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<(), Unsupported> {
        if !std::mem::take(&mut self.first) {
            self.writer.out.push(b',');
        }
        value.serialize(&mut *self.writer)
    }

    fn close(self) -> &'a mut Canonical {
        self.writer.depth -= 1;
        self.writer.out.push(b']');
        self.writer
    }
}

/// An externally tagged variant's object or array: `{"variant":…}`.
struct Variant<C> {
    inner: C,
}

macro_rules! primitive {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(fn $method(self, value: $ty) -> Result<(), Unsupported> {
            serde_json::Serializer::new(&mut self.out)
                .$method(value)
                .map_err(|_| Unsupported)
        })*
    };
}

impl<'a> ser::Serializer for &'a mut Canonical {
    type Ok = ();
    type Error = Unsupported;
    type SerializeSeq = Array<'a>;
    type SerializeTuple = Array<'a>;
    type SerializeTupleStruct = Array<'a>;
    type SerializeTupleVariant = Variant<Array<'a>>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Object<'a>;
    type SerializeStructVariant = Variant<Object<'a>>;

    primitive!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
    );

    fn serialize_i128(self, value: i128) -> Result<(), Unsupported> {
        // A `Value` number holds 64 bits at most.
        match (i64::try_from(value), u64::try_from(value)) {
            (Ok(small), _) => self.serialize_i64(small),
            (_, Ok(small)) => self.serialize_u64(small),
            _ => Err(Unsupported),
        }
    }

    fn serialize_u128(self, value: u128) -> Result<(), Unsupported> {
        u64::try_from(value)
            .map_err(|_| Unsupported)
            .and_then(|small| self.serialize_u64(small))
    }

    fn serialize_f32(self, value: f32) -> Result<(), Unsupported> {
        // A `Value` keeps an `f32` as the `f64` it converts to.
        self.serialize_f64(f64::from(value))
    }

    fn serialize_f64(self, value: f64) -> Result<(), Unsupported> {
        if value.is_finite() {
            serde_json::Serializer::new(&mut self.out)
                .serialize_f64(value)
                .map_err(|_| Unsupported)
        } else {
            // As `Value::from(f64)`: a number JSON cannot hold is `null`.
            self.serialize_unit()
        }
    }

    fn serialize_char(self, value: char) -> Result<(), Unsupported> {
        self.string(value.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, value: &str) -> Result<(), Unsupported> {
        self.string(value)
    }

    fn serialize_bytes(self, value: &[u8]) -> Result<(), Unsupported> {
        // A `Value` holds bytes as an array of numbers.
        let mut array = self.open_array();
        for byte in value {
            ser::SerializeSeq::serialize_element(&mut array, byte)?;
        }
        array.close();
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Unsupported> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Unsupported> {
        if self.in_key {
            return Err(Unsupported);
        }
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Unsupported> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Unsupported> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Unsupported> {
        self.string(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Unsupported> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Unsupported> {
        self.open_variant(variant)?;
        value.serialize(&mut *self)?;
        self.close_variant();
        Ok(())
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Array<'a>, Unsupported> {
        Ok(self.open_array())
    }

    fn serialize_tuple(self, _: usize) -> Result<Array<'a>, Unsupported> {
        Ok(self.open_array())
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Array<'a>, Unsupported> {
        Ok(self.open_array())
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Variant<Array<'a>>, Unsupported> {
        self.open_variant(variant)?;
        Ok(Variant {
            inner: self.open_array(),
        })
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Object<'a>, Unsupported> {
        Ok(self.open_object())
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Object<'a>, Unsupported> {
        Ok(self.open_object())
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Variant<Object<'a>>, Unsupported> {
        self.open_variant(variant)?;
        Ok(Variant {
            inner: self.open_object(),
        })
    }
}

impl ser::SerializeSeq for Array<'_> {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unsupported> {
        self.element(value)
    }

    fn end(self) -> Result<(), Unsupported> {
        self.close();
        Ok(())
    }
}

impl ser::SerializeTuple for Array<'_> {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unsupported> {
        self.element(value)
    }

    fn end(self) -> Result<(), Unsupported> {
        self.close();
        Ok(())
    }
}

impl ser::SerializeTupleStruct for Array<'_> {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unsupported> {
        self.element(value)
    }

    fn end(self) -> Result<(), Unsupported> {
        self.close();
        Ok(())
    }
}

impl ser::SerializeTupleVariant for Variant<Array<'_>> {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unsupported> {
        self.inner.element(value)
    }

    fn end(self) -> Result<(), Unsupported> {
        self.inner.close().close_variant();
        Ok(())
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Unsupported> {
        self.any_key(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unsupported> {
        self.value(value)
    }

    fn end(self) -> Result<(), Unsupported> {
        self.close().map(drop)
    }
}

impl ser::SerializeStruct for Object<'_> {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Unsupported> {
        self.str_key(key)?;
        self.value(value)
    }

    fn end(self) -> Result<(), Unsupported> {
        self.close().map(drop)
    }
}

impl ser::SerializeStructVariant for Variant<Object<'_>> {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Unsupported> {
        self.inner.str_key(key)?;
        self.inner.value(value)
    }

    fn end(self) -> Result<(), Unsupported> {
        self.inner.close()?.close_variant();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use super::*;

    /// The canonical form as first defined: the value's `Value`, written with sorted keys.
    fn through_value<T: Serialize>(value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        super::super::write_canonical(&serde_json::to_value(value).unwrap(), &mut out);
        out
    }

    fn same<T: Serialize>(value: &T) {
        let (direct, _) = to_canonical(value).unwrap();
        assert_eq!(
            String::from_utf8(direct).unwrap(),
            String::from_utf8(through_value(value)).unwrap()
        );
    }

    #[derive(Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Tagged {
        Zulu { b: u8, a: Option<String> },
        Alpha(BTreeMap<String, i32>),
    }

    #[derive(Serialize)]
    enum External {
        Unit,
        New(Vec<f32>),
        Tuple(i128, u128, char),
        Shape { z: bool, y: (), x: Option<u8> },
    }

    #[derive(Serialize)]
    #[serde(tag = "t", content = "c")]
    enum Adjacent {
        Some { k: String },
    }

    #[derive(Serialize)]
    struct Flat {
        zz: u8,
        #[serde(flatten)]
        kind: Tagged,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<u8>,
        #[serde(with = "serde_bytes_as_seq")]
        bytes: Vec<u8>,
    }

    mod serde_bytes_as_seq {
        pub(super) fn serialize<S: serde::Serializer>(
            bytes: &[u8],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(bytes)
        }
    }

    #[derive(Serialize)]
    struct Unit;

    #[derive(Serialize)]
    struct Wrapper(Value);

    /// Everything serde hands a serializer comes out as the `Value` path writes it.
    #[test]
    fn values_are_written_as_their_sorted_value() {
        same(&json!({
            "b": 1, "a": [{"d": 2, "c": "é\u{1}\"\\"}], "": null,
            "ab!": 1, "ab": 2, "a b": 3, "é": 6, "z": -0.0,
            "n": [1.5e300, -7, 18446744073709551615u64, true, false, {}, []]
        }));
        same(&Tagged::Zulu { b: 1, a: None });
        same(&Tagged::Alpha([("y".into(), 1), ("x".into(), -2)].into()));
        same(&vec![
            External::Unit,
            External::New(vec![0.1, f32::NAN, f32::INFINITY]),
            External::Tuple(-5, 7, 'ß'),
            External::Shape {
                z: true,
                y: (),
                x: Some(3),
            },
        ]);
        same(&Adjacent::Some { k: "v".into() });
        same(&Flat {
            zz: 9,
            kind: Tagged::Zulu {
                b: 2,
                a: Some("q".into()),
            },
            skipped: None,
            bytes: vec![0, 255],
        });
        same(&(Unit, Wrapper(json!({"y": 1, "x": 2})), f64::NAN, 'c'));
        same(&BTreeMap::from([
            (10, "ten"),
            (-2, "minus two"),
            (3, "three"),
        ]));
        same(&BTreeMap::from([(10u64, "ten"), (9, "nine")]));
    }

    /// The top-level object's entries come back in key order, each naming its key and value.
    #[test]
    fn the_top_level_entries_are_given_in_order() {
        let (out, top) = to_canonical(&json!({"b": [1, {"y": 2, "x": 1}], "a": "s"})).unwrap();
        let entries: Vec<(&str, &str)> = top
            .iter()
            .map(|entry| {
                (
                    std::str::from_utf8(entry.key(&out)).unwrap(),
                    std::str::from_utf8(entry.value(&out)).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            entries,
            [(r#""a""#, r#""s""#), (r#""b""#, r#"[1,{"x":1,"y":2}]"#)]
        );
        assert!(to_canonical(&[1, 2]).unwrap().1.is_empty());
    }

    /// What the direct writer cannot render as the `Value` path does, it refuses.
    #[test]
    fn what_the_value_path_would_render_otherwise_is_refused() {
        struct Twice;
        impl Serialize for Twice {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = s.serialize_map(None)?;
                map.serialize_entry("k", &1)?;
                map.serialize_entry("j", &2)?;
                map.serialize_entry("k", &3)?;
                map.end()
            }
        }
        assert!(to_canonical(&Twice).is_err());
        for escaped in ["a\"b", "a\\", "a\n"] {
            assert!(to_canonical(&json!({ escaped: 1 })).is_err(), "{escaped:?}");
        }
        assert!(to_canonical(&BTreeMap::from([(true, 1)])).is_err());
        assert!(to_canonical(&BTreeMap::from([(Some("a"), 1)])).is_err());
        struct KeyWithoutValue;
        impl Serialize for KeyWithoutValue {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = s.serialize_map(None)?;
                map.serialize_key("b")?;
                map.serialize_entry("a", &1)?;
                map.end()
            }
        }
        assert!(to_canonical(&KeyWithoutValue).is_err());
        assert!(to_canonical(&BTreeMap::from([((1, 2), 1)])).is_err());
        assert!(to_canonical(&u128::MAX).is_err());
        assert!(to_canonical(&i128::MIN).is_err());
    }
}
