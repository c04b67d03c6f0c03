//! The shape of the API under attack: where its orders live, what their
//! members and the idempotency headers are called, which routes it lacks.
//! This API's shape is the default; `seed` is the shape of the design the
//! pattern started from; any other is a small JSON file that may extend a
//! built-in shape.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Where the orders live and how an order is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Shape {
    /// The orders collection: `POST` creates, `GET` lists, `{base_path}/{id}` is one order.
    pub base_path: String,
    /// The member of an order that holds its id (any JSON type: a string or a number).
    pub id_field: String,
    /// The order's item (a string): the runner marks its orders with it.
    pub item_field: String,
    /// The order's quantity (an integer).
    pub quantity_field: String,
    /// The order's price (a number).
    pub price_field: String,
    /// Where the caller's orders are listed (empty: the base path). The
    /// answer is a JSON array of orders, or an object with them under
    /// `data` (or as its one array member).
    pub list_path: String,
    /// The query string of the listing's first page (`GET {list_path}?{list_query}`);
    /// later pages follow a `next_cursor` member, if any, as `cursor=`.
    pub list_query: String,
    /// Where one order is read (`GET`), changed (`PATCH`) and cancelled
    /// (`DELETE`), with `{id}` for its id (empty: `{base_path}/{id}`).
    pub order_path: String,
    /// Members added to every order body the runner sends, e.g. `{"currency": "EUR"}`.
    pub extra: Map<String, Value>,
    /// The request header that carries the key (`X-Idempotency-Key`,
    /// `PayPal-Request-Id`, …).
    pub key_header: String,
    /// The response header that marks a replay (value `true`):
    /// `Idempotency-Replayed`, `X-Idempotent-Replayed`, …
    pub replay_header: String,
    /// The routes the target does not have, of [`ROUTES`]: the checks (or
    /// the parts of a check) that need one are skipped, saying why.
    pub lacks: Vec<String>,
}

/// The routes a profile can say a target lacks: `GET` one order, `PATCH`
/// one, `DELETE` one, `LIST` the orders.
pub const ROUTES: &[&str] = &["GET", "PATCH", "DELETE", "LIST"];

impl Default for Shape {
    /// This API's shape (CONTRACT §3).
    fn default() -> Self {
        Self {
            base_path: crate::DEFAULT_BASE_PATH.to_owned(),
            id_field: "id".to_owned(),
            item_field: "item".to_owned(),
            quantity_field: "quantity".to_owned(),
            price_field: "price".to_owned(),
            list_path: String::new(),
            list_query: "limit=100".to_owned(),
            order_path: String::new(),
            extra: Map::new(),
            key_header: "Idempotency-Key".to_owned(),
            replay_header: "Idempotent-Replayed".to_owned(),
            lacks: Vec::new(),
        }
    }
}

/// The built-in profiles, by name.
pub const PROFILES: &[&str] = &["orders-api", "seed"];

impl Shape {
    /// The seed's design: `/orders`, `item`/`quantity`/`price`, integer
    /// ids, one unpaginated listing, no `PATCH` and no `DELETE` (it has no
    /// authentication: run it without `--token`).
    pub fn seed() -> Self {
        Self {
            base_path: "/orders".to_owned(),
            list_query: String::new(),
            lacks: vec!["PATCH".to_owned(), "DELETE".to_owned()],
            ..Self::default()
        }
    }

    /// A built-in shape by name.
    pub fn built_in(name: &str) -> Option<Self> {
        match name {
            "orders-api" => Some(Self::default()),
            "seed" => Some(Self::seed()),
            _ => None,
        }
    }

    /// A built-in profile by name, or a JSON file of [`Shape`]'s members.
    /// The members a file leaves out take the values of the built-in shape
    /// its `"extends"` names (this API's without one).
    pub fn profile(name_or_file: &str) -> Result<Self, String> {
        if let Some(shape) = Self::built_in(name_or_file) {
            return Ok(shape);
        }
        let file = name_or_file;
        let text = std::fs::read_to_string(file).map_err(|e| {
            format!(
                "--profile {file}: neither a built-in profile ({}) nor a readable file: {e}",
                PROFILES.join(", ")
            )
        })?;
        Self::from_json(&text).map_err(|e| format!("--profile {file}: {e}"))
    }

    /// A profile's JSON text: an object of [`Shape`]'s members, and
    /// `"extends"`, the built-in shape that gives the members it leaves out.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let mut members: Map<String, Value> =
            serde_json::from_str(text).map_err(|e| format!("not a profile: {e}"))?;
        let base = match members.remove("extends") {
            None => Self::default(),
            Some(Value::String(name)) => Self::built_in(&name).ok_or_else(|| {
                format!(
                    "extends {name:?}: not a built-in shape ({})",
                    PROFILES.join(", ")
                )
            })?,
            Some(other) => {
                return Err(format!(
                    "extends {other}: the name of a built-in shape ({})",
                    PROFILES.join(", ")
                ));
            }
        };
        let Value::Object(mut shape) =
            serde_json::to_value(&base).map_err(|e| format!("not a profile: {e}"))?
        else {
            return Err("not a profile: a shape is an object".into());
        };
        shape.extend(members);
        let shape: Self = serde_json::from_value(Value::Object(shape))
            .map_err(|e| format!("not a profile: {e}"))?;
        shape.checked()
    }

    /// Whether the target has `route` (of [`ROUTES`]).
    pub fn has(&self, route: &str) -> bool {
        !self.lacks.iter().any(|r| r == route)
    }

    /// This shape, if its paths and names can be used.
    pub fn checked(mut self) -> Result<Self, String> {
        self.base_path = self.base_path.trim().trim_end_matches('/').to_owned();
        if !self.base_path.starts_with('/') {
            return Err(format!("base path {:?}: must start with /", self.base_path));
        }
        for (what, name) in [
            ("id field", &self.id_field),
            ("item field", &self.item_field),
            ("quantity field", &self.quantity_field),
            ("price field", &self.price_field),
        ] {
            if name.trim().is_empty() {
                return Err(format!("the {what} is empty"));
            }
        }
        self.list_query = self.list_query.trim_start_matches('?').to_owned();
        self.list_path = self.list_path.trim().to_owned();
        self.order_path = self.order_path.trim().to_owned();
        for (what, path) in [
            ("list path", &self.list_path),
            ("order path", &self.order_path),
        ] {
            if !path.is_empty() && !path.starts_with('/') {
                return Err(format!("{what} {path:?}: must start with /"));
            }
        }
        if !self.order_path.is_empty() && !self.order_path.contains("{id}") {
            return Err(format!("order path {:?}: has no {{id}}", self.order_path));
        }
        for (what, header) in [
            ("key header", &mut self.key_header),
            ("replay header", &mut self.replay_header),
        ] {
            *header = header.trim().to_owned();
            let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if header.is_empty() || !header.bytes().all(token) {
                return Err(format!("the {what} {header:?} is not a header name"));
            }
        }
        for route in &mut self.lacks {
            *route = route.trim().to_ascii_uppercase();
            if !ROUTES.contains(&route.as_str()) {
                return Err(format!(
                    "lacks {route:?}: not a route ({})",
                    ROUTES.join(", ")
                ));
            }
        }
        if !self.has("GET") && !self.has("LIST") {
            return Err(
                "lacks GET and LIST: without either, no check can tell which orders exist".into(),
            );
        }
        Ok(self)
    }

    /// Where the orders are listed.
    pub fn listing(&self) -> &str {
        if self.list_path.is_empty() {
            &self.base_path
        } else {
            &self.list_path
        }
    }

    /// The path of order `id` (already encoded for a path).
    pub fn order(&self, id: &str) -> String {
        if self.order_path.is_empty() {
            format!("{}/{id}", self.base_path)
        } else {
            self.order_path.replace("{id}", id)
        }
    }

    /// An order body with `item` and the quantity's and price's JSON text
    /// as given (`None` leaves the member out), then the extra members.
    pub fn body(&self, item: Option<&str>, quantity: Option<&str>, price: Option<&str>) -> String {
        let mut members = Vec::new();
        if let Some(item) = item {
            members.push(format!(
                "{}:{}",
                json_string(&self.item_field),
                json_string(item)
            ));
        }
        for (name, text) in [(&self.quantity_field, quantity), (&self.price_field, price)] {
            if let Some(text) = text {
                members.push(format!("{}:{text}", json_string(name)));
            }
        }
        for (name, value) in &self.extra {
            members.push(format!("{}:{value}", json_string(name)));
        }
        format!("{{{}}}", members.join(","))
    }

    /// The order an answer carries: the body itself, or the object under
    /// its `data` member (an envelope), whichever has the id member.
    pub fn order_in<'a>(&self, answer: &'a Value) -> Option<&'a Value> {
        if answer.get(&self.id_field).is_some() {
            return Some(answer);
        }
        answer
            .get("data")
            .filter(|d| d.get(&self.id_field).is_some())
    }

    /// The id of an order object, as text: a string as it is, a number as
    /// its digits.
    pub fn id_of(&self, order: &Value) -> Option<String> {
        match order.get(&self.id_field)? {
            Value::String(id) if !id.is_empty() => Some(id.clone()),
            Value::Number(id) => Some(id.to_string()),
            _ => None,
        }
    }

    /// The orders of a listing's answer: a JSON array, or the array under
    /// `data` (or the one array member) of an object.
    pub fn listed(answer: &Value) -> Option<Vec<Value>> {
        match answer {
            Value::Array(orders) => Some(orders.clone()),
            Value::Object(members) => {
                if let Some(Value::Array(orders)) = members.get("data") {
                    return Some(orders.clone());
                }
                let mut arrays = members.values().filter_map(Value::as_array);
                match (arrays.next(), arrays.next()) {
                    (Some(orders), None) => Some(orders.clone()),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

fn json_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_uses_the_shape_s_names_keeps_the_number_text_and_adds_the_extras() {
        let mut shape = Shape::default();
        assert_eq!(
            shape.body(Some("atk-1"), Some("1.0"), Some("9.990")),
            r#"{"item":"atk-1","quantity":1.0,"price":9.990}"#
        );
        shape.quantity_field = "qty".into();
        shape.extra.insert("currency".into(), Value::from("EUR"));
        assert_eq!(
            shape.body(None, Some("2"), None),
            r#"{"qty":2,"currency":"EUR"}"#
        );
    }

    #[test]
    fn an_id_may_be_a_string_or_a_number() {
        let shape = Shape::default();
        assert_eq!(
            shape.id_of(&serde_json::json!({"id": "0193-a"})).as_deref(),
            Some("0193-a")
        );
        assert_eq!(
            shape.id_of(&serde_json::json!({"id": 42})).as_deref(),
            Some("42")
        );
        assert_eq!(shape.id_of(&serde_json::json!({"id": null})), None);
        assert_eq!(shape.id_of(&serde_json::json!({"order_id": 1})), None);
    }

    #[test]
    fn an_answer_carries_its_order_as_the_body_or_under_data() {
        let shape = Shape::default();
        let bare = serde_json::json!({"id": 7, "item": "x"});
        assert_eq!(shape.order_in(&bare), Some(&bare));
        let wrapped = serde_json::json!({"data": {"id": 7}, "meta": {}});
        assert_eq!(
            shape.order_in(&wrapped),
            Some(&serde_json::json!({"id": 7}))
        );
        assert_eq!(shape.order_in(&serde_json::json!({"error": "no"})), None);
    }

    #[test]
    fn the_paths_default_to_the_base_path_and_an_order_path_needs_an_id() {
        let shape = Shape::seed();
        assert_eq!(
            (shape.listing(), shape.order("7").as_str()),
            ("/orders", "/orders/7")
        );
        let own = Shape {
            list_path: "/me/orders".into(),
            order_path: "/order/{id}/view".into(),
            ..Shape::default()
        };
        assert_eq!(
            (own.listing(), own.order("7").as_str()),
            ("/me/orders", "/order/7/view")
        );
        let wrong = Shape {
            order_path: "/orders/one".into(),
            ..Shape::default()
        };
        assert!(wrong.checked().unwrap_err().contains("{id}"));
    }

    #[test]
    fn a_listing_is_an_array_or_the_array_in_an_object() {
        let one = serde_json::json!([{"id": 1}]);
        assert_eq!(Shape::listed(&one).map(|l| l.len()), Some(1));
        let paged = serde_json::json!({"data": [{"id": 1}, {"id": 2}], "next_cursor": null});
        assert_eq!(Shape::listed(&paged).map(|l| l.len()), Some(2));
        let named = serde_json::json!({"orders": [], "total": 0});
        assert_eq!(Shape::listed(&named).map(|l| l.len()), Some(0));
        assert_eq!(Shape::listed(&serde_json::json!({"a": [], "b": []})), None);
    }

    #[test]
    fn a_profile_file_overrides_only_what_it_names() {
        let dir = std::env::temp_dir().join(format!("atk-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("shop.json");
        std::fs::write(
            &file,
            r#"{"base_path": "/api/orders/", "quantity_field": "qty"}"#,
        )
        .unwrap();
        let shape = Shape::profile(file.to_str().unwrap()).unwrap();
        assert_eq!(shape.base_path, "/api/orders");
        assert_eq!(shape.quantity_field, "qty");
        assert_eq!(shape.item_field, "item");
        std::fs::write(&file, r#"{"base": "/x"}"#).unwrap();
        assert!(
            Shape::profile(file.to_str().unwrap())
                .unwrap_err()
                .contains("unknown field")
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(Shape::profile("seed").unwrap().base_path, "/orders");
        assert!(Shape::profile("seed").unwrap().has("GET"));
        assert!(!Shape::profile("seed").unwrap().has("DELETE"));
        assert!(
            Shape::profile("no-such-profile")
                .unwrap_err()
                .contains("built-in")
        );
    }

    #[test]
    fn a_profile_that_extends_a_built_in_shape_takes_its_members_and_names_the_headers() {
        let shape = Shape::from_json(
            r#"{"extends": "seed", "key_header": "PayPal-Request-Id",
                "replay_header": "X-Idempotent-Replayed", "lacks": ["delete"]}"#,
        )
        .unwrap();
        assert_eq!(shape.base_path, "/orders");
        assert_eq!(shape.list_query, "");
        assert_eq!(shape.key_header, "PayPal-Request-Id");
        assert_eq!(shape.replay_header, "X-Idempotent-Replayed");
        assert_eq!(shape.lacks, ["DELETE"]);
        let plain = Shape::from_json(r#"{"quantity_field": "qty"}"#).unwrap();
        assert_eq!(plain.list_query, "limit=100");
        for (wrong, says) in [
            (r#"{"extends": "stripe"}"#, "not a built-in shape"),
            (r#"{"extends": 1}"#, "the name of a built-in shape"),
            (r#"{"lacks": ["PUT"]}"#, "not a route"),
            (r#"{"lacks": ["GET", "LIST"]}"#, "without either"),
            (r#"{"key_header": "Idempotency Key"}"#, "not a header name"),
        ] {
            let refused = Shape::from_json(wrong).unwrap_err();
            assert!(refused.contains(says), "{wrong}: {refused}");
        }
    }
}
