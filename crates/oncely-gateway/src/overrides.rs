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

/// Why a body cannot be read for overrides as the application would read it: refused where a
/// protected route's path is (failing closed — what the gateway cannot read, it cannot clear).
pub type Unreadable = &'static str;

/// The methods a body names in a `_method` field, read as body parsers read it, or why it
/// cannot be read so. `content_encoding`: the request's `Content-Encoding`, if any (body
/// parsers inflate gzip, deflate and br: an encoded body is [`Unreadable`]); `content_type`:
/// its `Content-Type` (a charset other than UTF-8 is unreadable; a UTF-8 byte order mark is
/// skipped, as body parsers skip it).
///
/// - multipart: each part whose headers mention `_method` (its value unread: the part names
///   an override);
/// - JSON (by its type, or any body that starts like an object): a top-level member read as
///   `_method` — JSON that does not parse is unreadable (a JavaScript parser takes lone
///   surrogates, `1e400` and any nesting that this one refuses);
/// - anything else: the parameters of a urlencoded form (decoded) — every body parses as one.
pub fn in_body(
    content_encoding: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Vec<String>, Unreadable> {
    if body.is_empty() {
        return Ok(Vec::new());
    }
    if content_encoding.is_some_and(|coding| !coding.trim().eq_ignore_ascii_case("identity")) {
        return Err("an encoded body (Content-Encoding)");
    }
    let content_type = content_type.unwrap_or_default();
    let charset = content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches('"').to_ascii_lowercase())
    });
    if charset.is_some_and(|charset| charset != "utf-8" && charset != "utf8") {
        return Err("a body in a charset other than UTF-8");
    }
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let essence = essence(content_type);
    if essence == "multipart/form-data" {
        return Ok(in_multipart(content_type, body));
    }
    let json_typed =
        essence == "application/json" || essence == "text/json" || essence.ends_with("+json");
    let object_like = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if json_typed || object_like {
        return match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(serde_json::Value::Object(fields)) => Ok(fields
                .iter()
                .filter(|(name, _)| is_method_parameter(name))
                .map(|(_, value)| match value {
                    serde_json::Value::String(text) => text.trim().to_owned(),
                    other => other.to_string(),
                })
                .collect()),
            Ok(_) => Ok(Vec::new()),
            Err(_) => Err("JSON the gateway cannot read"),
        };
    }
    Ok(in_form(body))
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
/// regard to case or surrounding blanks, with PHP's `.` and space as `_`, and any bracketed or
/// dotted segment of it (`_method[]`, `[_method]` — qs reads it as `_method` —, `a[_method]`,
/// `_method.x`) counting.
fn is_method_parameter(name: &str) -> bool {
    let name = name.trim();
    let php: String = name
        .chars()
        .map(|c| if matches!(c, '.' | ' ') { '_' } else { c })
        .collect();
    let is_method = |segment: &str| segment.trim().eq_ignore_ascii_case("_method");
    php.split(['[', ']']).any(is_method) || name.split(['[', ']', '.']).any(is_method)
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
        let form = Some("application/x-www-form-urlencoded");
        let body = |content_type, bytes: &[u8]| in_body(None, content_type, bytes);
        assert_eq!(
            body(form, b"name=ada&%5Fmethod=P%55T"),
            Ok(vec!["PUT".into()])
        );
        assert_eq!(body(form, b"%5B_method%5D=PUT"), Ok(vec!["PUT".into()]));
        assert_eq!(body(form, b"[_method]=PUT"), Ok(vec!["PUT".into()]));
        assert_eq!(body(form, b"name=ada"), Ok(vec![]));
        let multipart = Some("multipart/form-data; boundary=XyZ");
        let parts =
            b"--XyZ\r\nContent-Disposition: form-data; name=\"_METHOD\"\r\n\r\nPUT\r\n--XyZ--\r\n";
        assert_eq!(body(multipart, parts).unwrap().len(), 1);
        let plain = b"--XyZ\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\n_method\r\n--XyZ--\r\n";
        assert_eq!(body(multipart, plain), Ok(vec![]), "a value is no name");
        let json = Some("application/json");
        assert_eq!(body(json, br#"{"_method":"put"}"#), Ok(vec!["put".into()]));
        assert_eq!(
            body(json, br#"{"\u005fmethod":"put"}"#),
            Ok(vec!["put".into()])
        );
        assert_eq!(
            body(json, b"\xEF\xBB\xBF{\"_method\":\"put\"}"),
            Ok(vec!["put".into()])
        );
        assert_eq!(body(json, br#"{"method":"put"}"#), Ok(vec![]));
        // Any body that starts like an object is read as JSON, whatever its type says.
        assert_eq!(
            body(Some("text/plain"), br#" {"_method":"put"}"#),
            Ok(vec!["put".into()])
        );
        assert_eq!(body(None, b"_method=PUT"), Ok(vec!["PUT".into()]));
    }

    #[test]
    fn what_cannot_be_read_as_the_application_reads_it_is_unreadable() {
        let json = Some("application/json");
        for bytes in [
            &br#"{"x":"\ud800","_method":"PUT"}"#[..],
            br#"{"x":1e400,"_method":"PUT"}"#,
            br#"{"_method":"PUT""#,
        ] {
            assert!(
                in_body(None, json, bytes).is_err(),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
        let deep = format!(
            "{{\"_method\":\"PUT\",\"x\":{}{}}}",
            "[".repeat(200),
            "]".repeat(200)
        );
        assert!(in_body(None, json, deep.as_bytes()).is_err());
        assert!(in_body(Some("gzip"), json, b"\x1f\x8b").is_err());
        assert!(in_body(Some("identity"), json, b"{}").is_ok());
        let utf16 = Some("application/json; charset=utf-16le");
        assert!(in_body(None, utf16, b"{\0}\0").is_err());
        assert!(in_body(None, Some("application/json; charset=UTF-8"), b"{}").is_ok());
        assert_eq!(
            in_body(Some("gzip"), json, b""),
            Ok(vec![]),
            "no body, nothing to read"
        );
    }
}
