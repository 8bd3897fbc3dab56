//! Integers written as integral floats.
//!
//! JSON Schema counts `4197.0` as an integer, so a client generated from the
//! OpenAPI document may send it where the document says `integer`; serde
//! refuses it. A body (or query string) that failed only because of that is
//! read a second time through [`Lenient`], a deserializer wrapper that lets
//! every integer field take an integral float (and, in a query string, a
//! value such as `10.0`). Only fields that ask for an integer are touched:
//! a float inside a payload stays a float. The first, strict read is the
//! fast path; the second runs only after it failed.

use serde::de::{self, DeserializeSeed, Deserializer, Visitor};

/// Reads `T` from a JSON body, taking integral floats for integers. The
/// error says where (`tasks[0].ttl_ms: ...`), as axum's `Json` does.
pub(crate) fn json<T: de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(Lenient {
        inner: &mut de,
        strings: false,
    })
    .map_err(|e| format!("Failed to deserialize the JSON body into the target type: {e}"))?;
    de.end()
        .map_err(|e| format!("Failed to parse the request body as JSON: {e}"))?;
    Ok(value)
}

/// Whether a strict read's refusal was of a float where the type wanted
/// something else: the one case a second read through [`Lenient`] can mend.
pub(crate) fn refused_a_float(message: &str) -> bool {
    message.contains("invalid type: floating point")
}

/// Reads `T` from JSON text: strictly, and once more through [`Lenient`]
/// when only an integral float stood in the way.
pub(crate) fn from_str<T: de::DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    match serde_json::from_str(text) {
        Err(e) if e.is_data() && refused_a_float(&e.to_string()) => {
            let mut de = serde_json::Deserializer::from_str(text);
            let value = T::deserialize(Lenient {
                inner: &mut de,
                strings: false,
            })?;
            de.end()?;
            Ok(value)
        }
        other => other,
    }
}

/// A JSON value as a deserializer that takes integral floats for integers
/// (for types that read their body as a map first: `validate::object_only`).
pub(crate) fn value(value: serde_json::Value) -> Lenient<serde_json::Value> {
    Lenient {
        inner: value,
        strings: false,
    }
}

/// Reads `T` from a query string, taking `10.0` for the integer 10.
pub(crate) fn query<T: de::DeserializeOwned>(query: &str) -> Result<T, serde_urlencoded::de::Error> {
    T::deserialize(Lenient {
        inner: serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes())),
        strings: true,
    })
}

/// A deserializer whose integer requests also take integral floats; every
/// nested value is read through it too. `strings`: the values arrive as
/// text (a query string), so an integer may be written `"10.0"`.
pub(crate) struct Lenient<D> {
    inner: D,
    strings: bool,
}

/// Integral floats are taken up to 2^53 either way: beyond it a float is
/// not exact (`-9223372036854775809` reads as the float -2^63), so a value
/// that is no integer the client meant could pass as one.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// Hands an integral float to `v` as the integer it is, else as the float
/// (whose refusal then names the value and what was expected).
fn integral<'de, V: Visitor<'de>, E: de::Error>(v: V, f: f64) -> Result<V::Value, E> {
    if f.fract() == 0.0 && (-EXACT..=EXACT).contains(&f) {
        if f >= 0.0 {
            return v.visit_u64(f as u64);
        }
        return v.visit_i64(f as i64);
    }
    v.visit_f64(f)
}

/// The visitor of an integer request.
struct Int<V> {
    v: V,
    strings: bool,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Int<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.v.expecting(f)
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<V::Value, E> {
        self.v.visit_i64(n)
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<V::Value, E> {
        self.v.visit_u64(n)
    }
    fn visit_i128<E: de::Error>(self, n: i128) -> Result<V::Value, E> {
        self.v.visit_i128(n)
    }
    fn visit_u128<E: de::Error>(self, n: u128) -> Result<V::Value, E> {
        self.v.visit_u128(n)
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<V::Value, E> {
        integral(self.v, f)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<V::Value, E> {
        if !self.strings {
            return self.v.visit_str(s);
        }
        if let Ok(n) = s.parse::<u64>() {
            return self.v.visit_u64(n);
        }
        if let Ok(n) = s.parse::<i64>() {
            return self.v.visit_i64(n);
        }
        // Only plain decimal notation: "1e3" stays refused, as does "inf".
        let plain = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.' || b == b'-');
        match s.parse::<f64>() {
            Ok(f) if plain && f.fract() == 0.0 => integral(self.v, f),
            _ => self.v.visit_str(s),
        }
    }
}

/// The visitor of any other request: passes everything through, reading
/// nested values with [`Lenient`].
struct Wrap<V> {
    v: V,
    strings: bool,
}

macro_rules! pass {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(fn $method<E: de::Error>(self, x: $ty) -> Result<V::Value, E> {
            self.v.$method(x)
        })*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.v.expecting(f)
    }
    pass!(
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char),
        visit_str(&str),
        visit_string(String),
        visit_bytes(&[u8]),
        visit_byte_buf(Vec<u8>),
    );
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<V::Value, E> {
        self.v.visit_borrowed_str(s)
    }
    fn visit_borrowed_bytes<E: de::Error>(self, b: &'de [u8]) -> Result<V::Value, E> {
        self.v.visit_borrowed_bytes(b)
    }
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.v.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.v.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.v.visit_some(Lenient {
            inner: d,
            strings: self.strings,
        })
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.v.visit_newtype_struct(Lenient {
            inner: d,
            strings: self.strings,
        })
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.v.visit_seq(Access {
            inner: seq,
            strings: self.strings,
        })
    }
    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.v.visit_map(Access {
            inner: map,
            strings: self.strings,
        })
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.v.visit_enum(Access {
            inner: data,
            strings: self.strings,
        })
    }
}

/// A seed whose value is read with [`Lenient`].
struct Seed<S> {
    seed: S,
    strings: bool,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Lenient {
            inner: d,
            strings: self.strings,
        })
    }
}

/// A sequence, map, enum or variant whose elements are read with [`Lenient`].
struct Access<A> {
    inner: A,
    strings: bool,
}

impl<A> Access<A> {
    fn seed<S>(&self, seed: S) -> Seed<S> {
        Seed {
            seed,
            strings: self.strings,
        }
    }
    fn wrap<V>(&self, v: V) -> Wrap<V> {
        Wrap {
            v,
            strings: self.strings,
        }
    }
}

impl<'de, A: de::SeqAccess<'de>> de::SeqAccess<'de> for Access<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_element_seed(seed)
    }
    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: de::MapAccess<'de>> de::MapAccess<'de> for Access<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_key_seed(seed)
    }
    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_value_seed(seed)
    }
    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: de::EnumAccess<'de>> de::EnumAccess<'de> for Access<A> {
    type Error = A::Error;
    type Variant = Access<A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self::Variant), A::Error> {
        let strings = self.strings;
        let (value, variant) = self.inner.variant_seed(Seed { seed, strings })?;
        Ok((
            value,
            Access {
                inner: variant,
                strings,
            },
        ))
    }
}

impl<'de, A: de::VariantAccess<'de>> de::VariantAccess<'de> for Access<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        let seed = self.seed(seed);
        self.inner.newtype_variant_seed(seed)
    }
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, v: V) -> Result<V::Value, A::Error> {
        let v = self.wrap(v);
        self.inner.tuple_variant(len, v)
    }
    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], v: V) -> Result<V::Value, A::Error> {
        let v = self.wrap(v);
        self.inner.struct_variant(fields, v)
    }
}

macro_rules! integers {
    ($($method:ident),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
            let strings = self.strings;
            if strings {
                self.inner.deserialize_str(Int { v, strings })
            } else {
                self.inner.deserialize_any(Int { v, strings })
            }
        })*
    };
}

macro_rules! others {
    ($($method:ident),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
            let strings = self.strings;
            self.inner.$method(Wrap { v, strings })
        })*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Lenient<D> {
    type Error = D::Error;

    integers!(
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
    );
    others!(
        deserialize_any,
        deserialize_bool,
        deserialize_i128,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_seq,
        deserialize_map,
        deserialize_identifier,
        deserialize_ignored_any,
    );

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, v: V) -> Result<V::Value, D::Error> {
        let strings = self.strings;
        self.inner.deserialize_unit_struct(name, Wrap { v, strings })
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, v: V) -> Result<V::Value, D::Error> {
        let strings = self.strings;
        self.inner.deserialize_newtype_struct(name, Wrap { v, strings })
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, v: V) -> Result<V::Value, D::Error> {
        let strings = self.strings;
        self.inner.deserialize_tuple(len, Wrap { v, strings })
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        v: V,
    ) -> Result<V::Value, D::Error> {
        let strings = self.strings;
        self.inner.deserialize_tuple_struct(name, len, Wrap { v, strings })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        let strings = self.strings;
        self.inner.deserialize_struct(name, fields, Wrap { v, strings })
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        let strings = self.strings;
        self.inner.deserialize_enum(name, variants, Wrap { v, strings })
    }
    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::value::RawValue;

    #[derive(Deserialize, Debug)]
    struct Item {
        ttl_ms: u64,
        max: Option<u32>,
        offset: i64,
        ratio: f64,
        payload: Box<RawValue>,
        tags: Vec<u16>,
        kind: Kind,
    }

    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "snake_case")]
    enum Kind {
        Plain,
        Sized { size: u8 },
    }

    #[test]
    fn integral_floats_fill_integers_and_nothing_else_changes() {
        let body = br#"{"ttl_ms": 4197.0, "max": 3e1, "offset": -2.0, "ratio": 2.0,
            "payload": {"x": 1.0, "y": [2.50]}, "tags": [1.0, 2], "kind": {"sized": {"size": 7.0}}}"#;
        assert!(
            serde_json::from_slice::<Item>(body).is_err(),
            "serde alone refuses them"
        );
        let item: Item = super::json(body).unwrap();
        assert_eq!(
            (item.ttl_ms, item.max, item.offset, item.ratio),
            (4197, Some(30), -2, 2.0)
        );
        assert_eq!(
            item.payload.get(),
            r#"{"x": 1.0, "y": [2.50]}"#,
            "the payload is kept byte for byte"
        );
        assert_eq!(item.tags, vec![1, 2]);
        assert_eq!(item.kind, Kind::Sized { size: 7 });
    }

    #[test]
    fn fractions_out_of_range_and_wrong_types_are_still_refused_with_their_path() {
        for (body, path) in [
            (r#"{"ttl_ms": 1.5}"#, "ttl_ms"),
            (r#"{"ttl_ms": -1.0}"#, "ttl_ms"),
            (r#"{"ttl_ms": 1e300}"#, "ttl_ms"),
            (r#"{"ttl_ms": 18446744073709551616}"#, "ttl_ms"),
            (r#"{"ttl_ms": 9007199254740994.0}"#, "ttl_ms"),
            (r#"{"ttl_ms": 1, "max": 1, "offset": -9223372036854775809}"#, "offset"),
            (r#"{"ttl_ms": "5"}"#, "ttl_ms"),
            (r#"{"ttl_ms": 1, "max": 5e9}"#, "max"),
            (
                r#"{"ttl_ms": 1, "max": 1, "offset": 0, "ratio": 0, "payload": 1, "tags": [70000.0]}"#,
                "tags[0]",
            ),
        ] {
            let err = super::json::<Item>(body.as_bytes()).unwrap_err();
            assert!(err.contains(&format!("target type: {path}: ")), "{body}: {err}");
        }
        let trailing =
            br#"{"ttl_ms": 1.0, "max": null, "offset": 0, "ratio": 0, "payload": 1, "tags": [], "kind": "plain"} x"#;
        assert!(super::json::<Item>(trailing).is_err(), "trailing characters");
    }

    #[derive(Deserialize, Debug, PartialEq)]
    struct Query {
        limit: Option<u32>,
        cursor: u64,
        queue: Option<String>,
    }

    #[test]
    fn a_query_takes_integral_decimals_and_keeps_strings() {
        let q: Query = super::query("limit=10.0&cursor=0&queue=1.0").unwrap();
        assert_eq!(
            q,
            Query {
                limit: Some(10),
                cursor: 0,
                queue: Some("1.0".into())
            }
        );
        for bad in [
            "cursor=1.5",
            "cursor=1e3",
            "cursor=inf",
            "cursor=-1.0",
            "cursor=abc",
            "cursor=",
        ] {
            assert!(super::query::<Query>(bad).is_err(), "{bad}");
        }
    }
}
