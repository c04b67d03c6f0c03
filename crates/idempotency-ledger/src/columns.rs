//! More column types a [`Row`](crate::row::Row) takes, beside text,
//! integers, bytes and [`Timestamp`](crate::row::Timestamp): `bool`, `f32`,
//! `f64`, NULL (an `Option` of a bool, a float, an integer, text or bytes),
//! and a UUID ([`Uuid`]).

#[cfg(feature = "postgres")]
use diesel::pg::Pg;
use diesel::query_builder::AstPass;
use diesel::result::Error as DieselError;
use diesel::sql_types::{BigInt, Binary, Bool, Double, Float, Integer, Nullable, Text};
#[cfg(feature = "sqlite")]
use diesel::sqlite::Sqlite;

use crate::row::Bind;

macro_rules! bind_as {
    ($rust:ty, $sqlite:ty, $pg:ty) => {
        #[cfg(feature = "sqlite")]
        impl Bind<Sqlite> for $rust {
            fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Sqlite>) -> Result<(), DieselError> {
                out.push_bind_param::<$sqlite, $rust>(self)
            }
        }
        #[cfg(feature = "postgres")]
        impl Bind<Pg> for $rust {
            fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> Result<(), DieselError> {
                out.push_bind_param::<$pg, $rust>(self)
            }
        }
    };
}

bind_as!(bool, Bool, Bool);
bind_as!(f32, Float, Float);
bind_as!(f64, Double, Double);
bind_as!(Option<bool>, Nullable<Bool>, Nullable<Bool>);
bind_as!(Option<f32>, Nullable<Float>, Nullable<Float>);
bind_as!(Option<f64>, Nullable<Double>, Nullable<Double>);
bind_as!(Option<i32>, Nullable<Integer>, Nullable<Integer>);
bind_as!(Option<i64>, Nullable<BigInt>, Nullable<BigInt>);
bind_as!(Option<String>, Nullable<Text>, Nullable<Text>);
bind_as!(Option<Vec<u8>>, Nullable<Binary>, Nullable<Binary>);

#[cfg(feature = "sqlite")]
impl Bind<Sqlite> for Option<&str> {
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Sqlite>) -> Result<(), DieselError> {
        out.push_bind_param::<Nullable<Text>, Option<&str>>(self)
    }
}

#[cfg(feature = "postgres")]
impl Bind<Pg> for Option<&str> {
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> Result<(), DieselError> {
        out.push_bind_param::<Nullable<Text>, Option<&str>>(self)
    }
}

/// A UUID as both backends store it: `UUID` on PostgreSQL, its hyphenated
/// text on SQLite (made once, when the value is made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uuid {
    id: uuid::Uuid,
    text: String,
}

impl Uuid {
    /// `id`, ready to bind on either backend.
    pub fn new(id: uuid::Uuid) -> Self {
        Self {
            text: id.hyphenated().to_string(),
            id,
        }
    }

    /// The UUID itself.
    pub fn get(&self) -> uuid::Uuid {
        self.id
    }
}

#[cfg(feature = "sqlite")]
impl Bind<Sqlite> for Uuid {
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Sqlite>) -> Result<(), DieselError> {
        out.push_bind_param::<Text, String>(&self.text)
    }
}

#[cfg(feature = "postgres")]
impl Bind<Pg> for Uuid {
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> Result<(), DieselError> {
        out.push_bind_param::<diesel::sql_types::Uuid, uuid::Uuid>(&self.id)
    }
}
