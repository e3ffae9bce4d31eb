//! Reads structs from objects only. A derived `Deserialize` also reads a
//! struct from a sequence of its fields in order (`[null, null]`, or `[]`
//! for one whose every field may be left out), which no schema of the API
//! allows: a body that puts an array where an object belongs would be
//! taken. [`ObjectsOnly`] wraps a deserializer and everything it hands on
//! (elements, keys, values, variants), and refuses a sequence wherever a
//! struct is read; all else passes through unchanged.
//!
//! What a derived reader buffers before it reads it (a flattened field,
//! the fields of an internally tagged enum's variant) is read from serde's
//! own buffer, out of its reach: such a field that holds a struct is read
//! through [`object`].

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};

/// A deserializer that reads every struct from a map only.
pub struct ObjectsOnly<D>(pub D);

/// Reads a field's value with every struct in it from an object only
/// (`#[serde(deserialize_with = ...)]`), for a field [`ObjectsOnly`] of
/// the whole does not reach.
pub fn object<'de, D: Deserializer<'de>, T: serde::Deserialize<'de>>(deserializer: D) -> Result<T, D::Error> {
    T::deserialize(ObjectsOnly(deserializer))
}

/// Hands a deserializer on wrapped.
struct Seed<S>(S);

/// Hands on what an access gives wrapped.
struct Wrapped<A>(A);

/// Hands what a visitor is given on wrapped; a struct's refuses a
/// sequence.
struct Visiting<V> {
    visitor: V,
    refuse_sequence: bool,
}

impl<V> Visiting<V> {
    fn any(visitor: V) -> Self {
        Visiting { visitor, refuse_sequence: false }
    }

    fn structure(visitor: V) -> Self {
        Visiting { visitor, refuse_sequence: true }
    }
}

macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, Self::Error> {
                self.0.$method($($arg,)* Visiting::any(visitor))
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectsOnly<D> {
    type Error = D::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        // Not as a map: a flattened struct takes only its own fields.
        self.0.deserialize_struct(name, fields, Visiting::structure(visitor))
    }

    forward! {
        deserialize_any(), deserialize_bool(), deserialize_i8(), deserialize_i16(), deserialize_i32(),
        deserialize_i64(), deserialize_i128(), deserialize_u8(), deserialize_u16(), deserialize_u32(),
        deserialize_u64(), deserialize_u128(), deserialize_f32(), deserialize_f64(), deserialize_char(),
        deserialize_str(), deserialize_string(), deserialize_bytes(), deserialize_byte_buf(),
        deserialize_option(), deserialize_unit(), deserialize_unit_struct(name: &'static str),
        deserialize_newtype_struct(name: &'static str), deserialize_seq(), deserialize_tuple(len: usize),
        deserialize_tuple_struct(name: &'static str, len: usize), deserialize_map(),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]), deserialize_identifier(),
        deserialize_ignored_any(),
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(ObjectsOnly(deserializer))
    }
}

macro_rules! pass {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(
            fn $method<E: de::Error>(self, value: $ty) -> Result<V::Value, E> {
                self.visitor.$method(value)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Visiting<V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(formatter)
    }

    pass! {
        visit_bool(bool), visit_i8(i8), visit_i16(i16), visit_i32(i32), visit_i64(i64), visit_i128(i128),
        visit_u8(u8), visit_u16(u16), visit_u32(u32), visit_u64(u64), visit_u128(u128), visit_f32(f32),
        visit_f64(f64), visit_char(char), visit_str(&str), visit_borrowed_str(&'de str), visit_string(String),
        visit_bytes(&[u8]), visit_borrowed_bytes(&'de [u8]), visit_byte_buf(Vec<u8>),
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(ObjectsOnly(deserializer))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_newtype_struct(ObjectsOnly(deserializer))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        if self.refuse_sequence {
            return Err(de::Error::invalid_type(de::Unexpected::Seq, &self));
        }
        self.visitor.visit_seq(Wrapped(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(Wrapped(map))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(Wrapped(data))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Wrapped<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Wrapped<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(Seed(seed))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Wrapped<A> {
    type Error = A::Error;
    type Variant = Wrapped<A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self::Variant), A::Error> {
        let (value, variant) = self.0.variant_seed(Seed(seed))?;
        Ok((value, Wrapped(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Wrapped<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(Seed(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, Visiting::any(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, Visiting::structure(visitor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Optional {
        #[serde(default)]
        a: Option<u32>,
        #[serde(default)]
        b: Vec<Inner>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        name: String,
        #[serde(default)]
        tags: std::collections::BTreeMap<String, String>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(tag = "type", rename_all = "camelCase")]
    enum Tagged {
        One { inner: Inner },
        Two,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(tag = "type", rename_all = "camelCase")]
    enum Reached {
        One {
            #[serde(deserialize_with = "object")]
            inner: Inner,
        },
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    enum External {
        Plain,
        With(Inner),
    }

    fn read<T: serde::de::DeserializeOwned>(json: serde_json::Value) -> Result<T, String> {
        T::deserialize(ObjectsOnly(json)).map_err(|e| e.to_string())
    }

    #[test]
    fn a_struct_is_read_from_an_object_and_refused_as_an_array_at_any_depth() {
        let json = serde_json::json!({"a": 1, "b": [{"name": "x", "tags": {"k": "v"}}]});
        let read_back: Optional = read(json).unwrap();
        assert_eq!(read_back.b[0].tags["k"], "v");
        assert!(serde_json::from_value::<Optional>(serde_json::json!([])).is_ok(), "what derive alone takes");
        assert!(read::<Optional>(serde_json::json!([])).unwrap_err().contains("invalid type: sequence"));
        let nested = read::<Optional>(serde_json::json!({"b": [["x"]]})).unwrap_err();
        assert!(nested.contains("invalid type: sequence"), "{nested}");
        let in_option = read::<Option<Inner>>(serde_json::json!(["x"])).unwrap_err();
        assert!(in_option.contains("invalid type: sequence"), "{in_option}");
    }

    #[test]
    fn enums_read_as_before_and_their_structs_from_objects_only() {
        let one: Tagged = read(serde_json::json!({"type": "one", "inner": {"name": "x"}})).unwrap();
        assert_eq!(one, Tagged::One { inner: Inner { name: "x".into(), tags: Default::default() } });
        assert_eq!(read::<Tagged>(serde_json::json!({"type": "two"})).unwrap(), Tagged::Two);
        // What an internally tagged enum buffers is out of reach, but for
        // a field read through `object`.
        assert!(read::<Tagged>(serde_json::json!({"type": "one", "inner": ["x"]})).is_ok());
        let reached = read::<Reached>(serde_json::json!({"type": "one", "inner": ["x"]})).unwrap_err();
        assert!(reached.contains("invalid type: sequence"), "{reached}");
        assert_eq!(read::<External>(serde_json::json!("plain")).unwrap(), External::Plain);
        let with: External = read(serde_json::json!({"with": {"name": "y"}})).unwrap();
        assert_eq!(with, External::With(Inner { name: "y".into(), tags: Default::default() }));
        assert!(read::<External>(serde_json::json!({"with": ["y"]})).is_err());
    }
}
