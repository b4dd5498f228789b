//! Where a payload's facets go: a map being built, or an event's facets being checked against
//! them without building them (each event read or appended is checked).

use serde::{
    Serialize,
    ser::{self, Impossible},
};
use serde_json::{Map, Value};

/// Receives a payload's facets, one by one, in the reference's order.
pub(super) trait Facets {
    /// The facet `name` is `value`, as `serde_json::to_value` renders it. Each name is put
    /// once per payload.
    fn put<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T);
}

impl Facets for Map<String, Value> {
    fn put<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) {
        // A facet is a scalar or a plain value: rendering it cannot fail.
        self.insert(
            name.to_owned(),
            serde_json::to_value(value).unwrap_or(Value::Null),
        );
    }
}

/// Compares the facets put with those an event holds.
pub(super) struct Matches<'a> {
    expected: &'a Map<String, Value>,
    put: usize,
    equal: bool,
}

impl<'a> Matches<'a> {
    pub(super) fn new(expected: &'a Map<String, Value>) -> Matches<'a> {
        Matches {
            expected,
            put: 0,
            equal: true,
        }
    }

    /// Whether every facet put is held, with its value, and nothing else is.
    pub(super) fn all(&self) -> bool {
        self.equal && self.put == self.expected.len()
    }
}

impl Facets for Matches<'_> {
    fn put<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) {
        if !self.equal {
            return;
        }
        self.put += 1;
        self.equal = self
            .expected
            .get(name)
            .is_some_and(|held| equals(held, value));
    }
}

/// Whether `held` is `serde_json::to_value(value)`: a scalar is compared in place, anything
/// else through its `Value`.
fn equals<T: Serialize + ?Sized>(held: &Value, value: &T) -> bool {
    match value.serialize(Scalar(held)) {
        Ok(equal) => equal,
        // As `Facets for Map` puts it: `null` for a value that cannot be rendered.
        Err(NotScalar) => serde_json::to_value(value).unwrap_or(Value::Null) == *held,
    }
}

/// A value that is not a scalar: it is compared through its `Value`.
#[derive(Debug)]
struct NotScalar;

impl std::fmt::Display for NotScalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a scalar")
    }
}

impl std::error::Error for NotScalar {}

impl ser::Error for NotScalar {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        NotScalar
    }
}

/// Compares a scalar with `.0` as `Value` equality would compare it with its rendering. The
/// numbers and booleans render without allocating, so they are rendered and compared (not
/// through `Value`'s `PartialEq<f64>` and kin, which hold `3` equal to `3.0`: a rendered `3.0`
/// is not the number `3`).
struct Scalar<'a>(&'a Value);

macro_rules! rendered {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(#[allow(clippy::cmp_owned, reason = "a number or boolean renders without allocating")]
        fn $method(self, value: $ty) -> Result<bool, NotScalar> {
            Ok(*self.0 == Value::from(value))
        })*
    };
}

macro_rules! not_scalar {
    ($($method:ident($($arg:ty),*) -> $ret:ty),* $(,)?) => {
        $(fn $method(self, $(_: $arg),*) -> Result<$ret, NotScalar> {
            Err(NotScalar)
        })*
    };
}

impl ser::Serializer for Scalar<'_> {
    type Ok = bool;
    type Error = NotScalar;
    type SerializeSeq = Impossible<bool, NotScalar>;
    type SerializeTuple = Impossible<bool, NotScalar>;
    type SerializeTupleStruct = Impossible<bool, NotScalar>;
    type SerializeTupleVariant = Impossible<bool, NotScalar>;
    type SerializeMap = Impossible<bool, NotScalar>;
    type SerializeStruct = Impossible<bool, NotScalar>;
    type SerializeStructVariant = Impossible<bool, NotScalar>;

    rendered!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
    );

    not_scalar!(
        serialize_i128(i128) -> bool,
        serialize_u128(u128) -> bool,
        serialize_bytes(&[u8]) -> bool,
        serialize_seq(Option<usize>) -> Self::SerializeSeq,
        serialize_tuple(usize) -> Self::SerializeTuple,
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct,
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant,
        serialize_map(Option<usize>) -> Self::SerializeMap,
        serialize_struct(&'static str, usize) -> Self::SerializeStruct,
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant,
    );

    fn serialize_char(self, value: char) -> Result<bool, NotScalar> {
        self.serialize_str(value.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, value: &str) -> Result<bool, NotScalar> {
        Ok(self.0.as_str() == Some(value))
    }

    fn serialize_none(self) -> Result<bool, NotScalar> {
        Ok(self.0.is_null())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<bool, NotScalar> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<bool, NotScalar> {
        Ok(self.0.is_null())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<bool, NotScalar> {
        Ok(self.0.is_null())
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<bool, NotScalar> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<bool, NotScalar> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<bool, NotScalar> {
        Err(NotScalar)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Kind {
        ToolCall,
        Other(u8),
    }

    /// Each kind of facet value matches exactly what its rendering equals.
    #[test]
    fn a_value_matches_what_its_rendering_equals() {
        fn check<T: Serialize>(value: T, held: &[Value]) {
            let rendered = serde_json::to_value(&value).unwrap_or(Value::Null);
            for held in held {
                assert_eq!(
                    equals(held, &value),
                    rendered == *held,
                    "{held} against {rendered}"
                );
            }
        }
        let held = [
            json!(null),
            json!(true),
            json!(false),
            json!(0),
            json!(3),
            json!(-3),
            json!(3.0),
            json!(0.25),
            json!("3"),
            json!("tool_call"),
            json!("é"),
            json!([3]),
            json!({"other": 3}),
        ];
        check(3u16, &held);
        check(3i64, &held);
        check(-3i32, &held);
        check(0usize, &held);
        check(3.0f64, &held);
        check(0.25f32, &held);
        check(f64::NAN, &held);
        check(true, &held);
        check("tool_call", &held);
        check('é', &held);
        check(Option::<u8>::None, &held);
        check(Some(3u8), &held);
        check((), &held);
        check(Kind::ToolCall, &held);
        check(Kind::Other(3), &held);
        check(vec![3], &held);
        check(3i128, &held);
        check(u128::MAX, &held);
        #[derive(Serialize)]
        struct Count(u16);
        check(Count(3), &held);
    }

    /// A map of facets matches only when it holds each facet put, and nothing more.
    #[test]
    fn facets_match_when_each_is_held_and_none_is_left() {
        let held: Map<String, Value> = [("a".to_owned(), json!("x")), ("b".to_owned(), json!(2))]
            .into_iter()
            .collect();
        let matches = |put: &[(&'static str, Value)]| {
            let mut matches = Matches::new(&held);
            for (name, value) in put {
                matches.put(name, value);
            }
            matches.all()
        };
        assert!(matches(&[("a", json!("x")), ("b", json!(2))]));
        assert!(!matches(&[("a", json!("x"))]));
        assert!(!matches(&[("a", json!("x")), ("b", json!(3))]));
        assert!(!matches(&[("a", json!("x")), ("c", json!(2))]));
        assert!(!matches(&[
            ("a", json!("x")),
            ("b", json!(2)),
            ("c", json!(1))
        ]));
    }
}
