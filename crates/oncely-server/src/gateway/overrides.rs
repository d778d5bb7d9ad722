//! Method overrides: the headers and `_method` parameters with which Rails, Laravel, Symfony,
//! Spring and Express' `method-override` let a `POST` be another method to the application.
//! Each framework reads them its own way — the first of comma-separated values (Express), the
//! last of repeated headers, a percent-escaped parameter name (`%5Fmethod`) or value
//! (`P%55T`), PHP's `.` and space in a name read as `_` — so the gateway does not try to guess
//! which method a request names: a request that names any is refused (400
//! `request-ambiguous`), on every route, unless the operator allowed overrides on its route
//! (`--allow-method-override`); there, it is refused only if one of the methods it names, any
//! way it is spelled, is protected at its path.

use axum::http::{HeaderMap, Method};

/// The override headers, as the frameworks name them.
pub const HEADERS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The methods a request names besides its own: every value of every override header (each
/// header repeated, each comma-separated value; an empty header names the empty method) and of
/// every `_method` parameter of `query`. Empty: it names none.
pub fn in_head(headers: &HeaderMap, query: Option<&str>) -> Vec<String> {
    let mut named = Vec::new();
    for name in HEADERS {
        for value in headers.get_all(name) {
            let value = String::from_utf8_lossy(value.as_bytes());
            named.extend(value.split(',').map(|m| m.trim().to_owned()));
        }
    }
    if let Some(query) = query {
        named.extend(in_form(query.as_bytes()));
    }
    named
}

/// Whether a body of this `Content-Type` can carry a `_method` an application reads: a form
/// (urlencoded or multipart) or JSON (a body parser's `req.body._method`).
pub fn body_may_name(content_type: Option<&str>) -> bool {
    let Some(content_type) = content_type else {
        return false;
    };
    let essence = essence(content_type);
    essence == "application/x-www-form-urlencoded"
        || essence == "multipart/form-data"
        || essence == "application/json"
        || essence.ends_with("+json")
}

/// The methods a body names in a `_method` field: a urlencoded form's parameters (decoded), a
/// multipart form's parts (any part whose headers mention `_method`: its value is not read,
/// the part names an override), a JSON object's top-level member.
pub fn in_body(content_type: &str, body: &[u8]) -> Vec<String> {
    let essence = essence(content_type);
    if essence == "application/x-www-form-urlencoded" {
        return in_form(body);
    }
    if essence == "multipart/form-data" {
        return in_multipart(content_type, body);
    }
    // JSON: a member whose name reads as `_method`, its value as text (a string, or anything
    // else as written).
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(fields)) => fields
            .iter()
            .filter(|(name, _)| is_method_parameter(name))
            .map(|(_, value)| match value {
                serde_json::Value::String(text) => text.trim().to_owned(),
                other => other.to_string(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A media type without its parameters, lower case (`multipart/form-data`).
fn essence(content_type: &str) -> String {
    let essence = content_type.split(';').next().unwrap_or("");
    essence.trim().to_ascii_lowercase()
}

/// Whether `method` (as a request names it: any case, with blanks) is protected at `path`.
pub fn names_protected(named: &[String], path: &str, routes: &super::Routes) -> bool {
    named.iter().any(|named| {
        Method::from_bytes(named.trim().to_ascii_uppercase().as_bytes())
            .is_ok_and(|method| routes.matching(&method, path).is_some())
    })
}

/// The values of the `_method` parameters of urlencoded `text` (names and values decoded).
fn in_form(text: &[u8]) -> Vec<String> {
    url::form_urlencoded::parse(text)
        .filter(|(name, _)| is_method_parameter(name))
        .map(|(_, value)| value.trim().to_owned())
        .collect()
}

/// Whether a parameter named `name` (decoded) is read as `_method` by some framework: without
/// regard to case or surrounding blanks, with PHP's `.` and space as `_`, and an array's
/// brackets (`_method[]`) ignored.
fn is_method_parameter(name: &str) -> bool {
    let name: String = name
        .trim()
        .chars()
        .map(|c| if matches!(c, '.' | ' ') { '_' } else { c })
        .collect();
    let base = name.split('[').next().unwrap_or("");
    base.eq_ignore_ascii_case("_method")
}

/// The parts of a multipart body whose headers mention `_method` (any case): each names an
/// override (its value `"?"`: not read). A body whose boundary cannot be found is searched
/// whole.
fn in_multipart(content_type: &str, body: &[u8]) -> Vec<String> {
    let mentions = |bytes: &[u8]| {
        bytes
            .windows(7)
            .any(|window| window.eq_ignore_ascii_case(b"_method"))
    };
    let boundary = content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_owned())
    });
    let Some(boundary) = boundary.filter(|b| !b.is_empty()) else {
        return if mentions(body) {
            vec!["?".into()]
        } else {
            Vec::new()
        };
    };
    let delimiter = format!("--{boundary}");
    let mut named = Vec::new();
    let mut rest = body;
    while let Some(at) = find(rest, delimiter.as_bytes()) {
        rest = &rest[at + delimiter.len()..];
        let head_end = find(rest, b"\r\n\r\n").unwrap_or(rest.len());
        if mentions(&rest[..head_end]) {
            named.push("?".into());
        }
    }
    named
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn every_value_of_every_override_header_is_named() {
        let named = in_head(
            &headers(&[
                ("x-http-method-override", "PUT, GET"),
                ("x-http-method-override", "patch"),
                ("x-method-override", ""),
            ]),
            None,
        );
        assert_eq!(named, ["PUT", "GET", "patch", ""]);
        assert!(in_head(&headers(&[("x-other", "PUT")]), None).is_empty());
    }

    #[test]
    fn method_parameters_are_read_decoded_however_they_are_spelled() {
        for query in [
            "_method=PUT",
            "%5Fmethod=PUT",
            "%5fmethod=PUT",
            "_method=P%55T",
            "a=1&_METHOD=PUT",
            "+_method+=PUT",
            ".method=PUT",
            "_method[]=PUT",
            "_method%5B%5D=PUT",
        ] {
            let named = in_head(&HeaderMap::new(), Some(query));
            assert_eq!(named.len(), 1, "{query}");
            assert!(named[0].eq_ignore_ascii_case("put"), "{query}: {named:?}");
        }
        assert!(in_head(&HeaderMap::new(), Some("method=PUT&x_method=PUT")).is_empty());
    }

    #[test]
    fn bodies_name_overrides_in_forms_multipart_and_json() {
        let form = "application/x-www-form-urlencoded";
        assert_eq!(in_body(form, b"name=ada&%5Fmethod=P%55T"), ["PUT"]);
        assert!(in_body(form, b"name=ada").is_empty());
        let multipart = "multipart/form-data; boundary=XyZ";
        let body =
            b"--XyZ\r\nContent-Disposition: form-data; name=\"_METHOD\"\r\n\r\nPUT\r\n--XyZ--\r\n";
        assert_eq!(in_body(multipart, body).len(), 1);
        let plain = b"--XyZ\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\n_method\r\n--XyZ--\r\n";
        assert!(in_body(multipart, plain).is_empty(), "a value is no name");
        assert_eq!(
            in_body("application/json", br#"{"_method":"put"}"#),
            ["put"]
        );
        assert!(in_body("application/json", br#"{"method":"put"}"#).is_empty());
        assert!(body_may_name(Some("Application/JSON; charset=utf-8")));
        assert!(body_may_name(Some("application/vnd.api+json")));
        assert!(!body_may_name(Some("text/plain")));
        assert!(!body_may_name(None));
    }
}
