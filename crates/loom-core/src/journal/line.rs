//! An event's journal line, serialized once ([`Line::encode`]) and checked to read back without
//! being parsed again.
//!
//! # Why no parse is needed
//!
//! A line is the output of `serde_json`'s serializer, so it is valid JSON made of the event's
//! own data; what decides whether it reads back is what the reader refuses in valid JSON of the
//! right shape. Three things can make the derived reader of [`Event`] refuse a line its
//! serializer wrote, and each is checked while the line is written:
//!
//! - **Nesting past the reader's recursion limit.** `serde_json` refuses the 128th level of
//!   nested objects and arrays, whatever the type read (a `Value`, a struct, a buffered tagged
//!   enum: every path counts the levels of the text). The formatter counts them as it writes
//!   and stops at the same level ([`READ_DEPTH`]).
//! - **A float JSON cannot hold.** The serializer writes a NaN or an infinity as `null`, which
//!   an `f64` field does not read. Every number passes through [`Finite`], which refuses a
//!   non-finite one, in an `Option` too (that `null` would read back as `None`: another value).
//! - **A timestamp outside the years 0000–9999**, which RFC 3339 (what `ser_ts` writes and
//!   `de_ts` reads) cannot write with four digits: `ser_ts` refuses it.
//!
//! Everything else the reader checks holds by construction of the types: strings are UTF-8,
//! keys are strings, optional fields read back from `null`, unit variants and tags are written
//! from the same derives that read them. The test
//! `journal::tests::every_event_of_the_reference_journals_reads_back_as_encoded` re-reads the
//! line of every event of the reference journals (every payload type), and the boundary tests
//! compare this check with a real parse at the depth limit, on non-finite numbers and on
//! extreme timestamps. In debug builds the line is also parsed back and a difference panics, so
//! every test that appends checks the claim again.

use std::{fmt, io};

use serde::{Serialize, Serializer, ser};

use crate::{event::Event, ports::StoreError};

/// The deepest nesting of objects and arrays `serde_json`'s reader accepts (its recursion limit
/// of 128 counts down on entering each level and refuses the level that reaches zero).
pub const READ_DEPTH: usize = 127;

/// Where the digits of the envelope's `seq`, its last field, start in `text`: after the last
/// `"seq":` (a quote inside a JSON string is escaped, so this is a key; the envelope's `seq` is
/// the last key written), followed by digits and the closing brace only.
fn seq_at(text: &str) -> Option<usize> {
    const KEY: &str = "\"seq\":";
    let at = text.rfind(KEY)? + KEY.len();
    let digits = text.get(at..)?.strip_suffix('}')?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(at)
}

/// An event's journal line (compact JSON, without the newline), serialized once: the line the
/// store writes, keeps or inserts, its `seq` set by [`Line::set_seq`] once the store assigns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The line.
    text: String,
    /// Where the seq's digits start in `text`.
    seq_at: usize,
}

impl Line {
    /// Serializes `event` (with its seq, until [`Line::set_seq`]) and checks that the line reads
    /// back (see the module doc), refusing it with [`StoreError::Invalid`] otherwise.
    pub fn encode(event: &Event) -> Result<Line, StoreError> {
        let refused = |reason: &dyn fmt::Display| {
            StoreError::Invalid(format!(
                "event {} ({}) would not read back, so it is not written: {reason}",
                event.event_id, event.event_type
            ))
        };
        let mut bytes = Vec::with_capacity(768);
        let mut ser = serde_json::Serializer::with_formatter(&mut bytes, Depth(0));
        event
            .serialize(Finite(&mut ser))
            .map_err(|err| refused(&err))?;
        let text = String::from_utf8(bytes).map_err(|err| refused(&err))?;
        let Some(seq_at) = seq_at(&text) else {
            return Err(refused(&"its line does not end with its seq"));
        };
        let line = Line { text, seq_at };
        #[cfg(debug_assertions)]
        line.assert_reads_back(event);
        Ok(line)
    }

    /// Writes `seq` into the line (the seq the store assigned to its event).
    pub fn set_seq(&mut self, seq: u64) {
        use std::fmt::Write as _;
        self.text.truncate(self.seq_at);
        // Writing into a `String` cannot fail.
        let _ = write!(self.text, "{seq}}}");
    }

    /// The line.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The line, owned.
    pub fn into_string(self) -> String {
        self.text
    }

    /// Debug builds: the claim of the module doc, checked on every line encoded.
    #[cfg(debug_assertions)]
    fn assert_reads_back(&self, event: &Event) {
        if let Err(err) = serde_json::from_str::<Event>(&self.text) {
            panic!(
                "event {} ({}) passed the journal's checks but does not read back: {err}",
                event.event_id, event.event_type
            );
        }
    }
}

/// The compact formatter, refusing nesting deeper than [`READ_DEPTH`] as it writes.
struct Depth(usize);

impl Depth {
    fn enter(&mut self) -> io::Result<()> {
        self.0 += 1;
        if self.0 > READ_DEPTH {
            return Err(io::Error::other(format!(
                "nested more than {READ_DEPTH} levels deep (the reader's recursion limit)"
            )));
        }
        Ok(())
    }
}

impl serde_json::ser::Formatter for Depth {
    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.enter()?;
        writer.write_all(b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0 -= 1;
        writer.write_all(b"]")
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.enter()?;
        writer.write_all(b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0 -= 1;
        writer.write_all(b"}")
    }
}

/// A serializer passing everything to `S`, except a float JSON cannot hold (NaN, infinities),
/// refused.
struct Finite<S>(S);

/// A value serialized through [`Finite`].
struct Checked<'a, T: ?Sized>(&'a T);

impl<T: ?Sized + Serialize> Serialize for Checked<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(Finite(serializer))
    }
}

fn finite<E: ser::Error>(value: f64) -> Result<(), E> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(E::custom(format!(
            "the number {value} cannot be written in JSON"
        )))
    }
}

impl<S: Serializer> Serializer for Finite<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Finite<S::SerializeSeq>;
    type SerializeTuple = Finite<S::SerializeTuple>;
    type SerializeTupleStruct = Finite<S::SerializeTupleStruct>;
    type SerializeTupleVariant = Finite<S::SerializeTupleVariant>;
    type SerializeMap = Finite<S::SerializeMap>;
    type SerializeStruct = Finite<S::SerializeStruct>;
    type SerializeStructVariant = Finite<S::SerializeStructVariant>;

    fn serialize_bool(self, v: bool) -> Result<S::Ok, S::Error> {
        self.0.serialize_bool(v)
    }
    fn serialize_i8(self, v: i8) -> Result<S::Ok, S::Error> {
        self.0.serialize_i8(v)
    }
    fn serialize_i16(self, v: i16) -> Result<S::Ok, S::Error> {
        self.0.serialize_i16(v)
    }
    fn serialize_i32(self, v: i32) -> Result<S::Ok, S::Error> {
        self.0.serialize_i32(v)
    }
    fn serialize_i64(self, v: i64) -> Result<S::Ok, S::Error> {
        self.0.serialize_i64(v)
    }
    fn serialize_i128(self, v: i128) -> Result<S::Ok, S::Error> {
        self.0.serialize_i128(v)
    }
    fn serialize_u8(self, v: u8) -> Result<S::Ok, S::Error> {
        self.0.serialize_u8(v)
    }
    fn serialize_u16(self, v: u16) -> Result<S::Ok, S::Error> {
        self.0.serialize_u16(v)
    }
    fn serialize_u32(self, v: u32) -> Result<S::Ok, S::Error> {
        self.0.serialize_u32(v)
    }
    fn serialize_u64(self, v: u64) -> Result<S::Ok, S::Error> {
        self.0.serialize_u64(v)
    }
    fn serialize_u128(self, v: u128) -> Result<S::Ok, S::Error> {
        self.0.serialize_u128(v)
    }
    fn serialize_f32(self, v: f32) -> Result<S::Ok, S::Error> {
        finite::<S::Error>(f64::from(v))?;
        self.0.serialize_f32(v)
    }
    fn serialize_f64(self, v: f64) -> Result<S::Ok, S::Error> {
        finite::<S::Error>(v)?;
        self.0.serialize_f64(v)
    }
    fn serialize_char(self, v: char) -> Result<S::Ok, S::Error> {
        self.0.serialize_char(v)
    }
    fn serialize_str(self, v: &str) -> Result<S::Ok, S::Error> {
        self.0.serialize_str(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<S::Ok, S::Error> {
        self.0.serialize_bytes(v)
    }
    fn serialize_none(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_none()
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.0.serialize_some(&Checked(value))
    }
    fn serialize_unit(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit()
    }
    fn serialize_unit_struct(self, name: &'static str) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit_struct(name)
    }
    fn serialize_unit_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit_variant(name, index, variant)
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0.serialize_newtype_struct(name, &Checked(value))
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0
            .serialize_newtype_variant(name, index, variant, &Checked(value))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        self.0.serialize_seq(len).map(Finite)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.0.serialize_tuple(len).map(Finite)
    }
    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.0.serialize_tuple_struct(name, len).map(Finite)
    }
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        self.0
            .serialize_tuple_variant(name, index, variant, len)
            .map(Finite)
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.0.serialize_map(len).map(Finite)
    }
    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        self.0.serialize_struct(name, len).map(Finite)
    }
    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        self.0
            .serialize_struct_variant(name, index, variant, len)
            .map(Finite)
    }
    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// The compound serializers: each element, key and value through [`Checked`].
macro_rules! compound {
    ($trait:ident, $method:ident) => {
        impl<S: ser::$trait> ser::$trait for Finite<S> {
            type Ok = S::Ok;
            type Error = S::Error;
            fn $method<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), S::Error> {
                self.0.$method(&Checked(value))
            }
            fn end(self) -> Result<S::Ok, S::Error> {
                self.0.end()
            }
        }
    };
}

compound!(SerializeSeq, serialize_element);
compound!(SerializeTuple, serialize_element);
compound!(SerializeTupleStruct, serialize_field);
compound!(SerializeTupleVariant, serialize_field);

impl<S: ser::SerializeMap> ser::SerializeMap for Finite<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), S::Error> {
        self.0.serialize_key(&Checked(key))
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), S::Error> {
        self.0.serialize_value(&Checked(value))
    }
    fn end(self) -> Result<S::Ok, S::Error> {
        self.0.end()
    }
}

impl<S: ser::SerializeStruct> ser::SerializeStruct for Finite<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), S::Error> {
        self.0.serialize_field(key, &Checked(value))
    }
    fn end(self) -> Result<S::Ok, S::Error> {
        self.0.end()
    }
}

impl<S: ser::SerializeStructVariant> ser::SerializeStructVariant for Finite<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), S::Error> {
        self.0.serialize_field(key, &Checked(value))
    }
    fn end(self) -> Result<S::Ok, S::Error> {
        self.0.end()
    }
}
