//! The routes the gateway protects: `METHOD /path/{param}` templates, how a request's path
//! matches one, and the paths it refuses because an upstream could read them as another path.

use std::fmt;

use http::Method;

/// One protected route: a method and a path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    method: Method,
    template: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// Matches this text, without regard to ASCII case.
    Literal(String),
    /// Matches any one non-empty segment.
    Param,
}

impl Route {
    /// Parses `METHOD /path` (`POST /orders/{id}/pay`).
    pub fn parse(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        let (method, path) = spec.split_once(char::is_whitespace).ok_or_else(|| {
            format!("route {spec:?}: write it as 'METHOD /path', e.g. 'POST /signup'")
        })?;
        let path = path.trim();
        let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| format!("route {spec:?}: {method:?} is not an HTTP method"))?;
        if matches!(
            method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::CONNECT
        ) {
            return Err(format!(
                "route {spec:?}: {method} is a safe method (or CONNECT), which the gateway never protects: name the methods that change something (POST, PUT, PATCH, DELETE)"
            ));
        }
        if !path.starts_with('/') {
            return Err(format!("route {spec:?}: the path must start with '/'"));
        }
        if path.contains(['?', '#', '*', '%', '\\', ';'])
            || !path.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(format!(
                "route {spec:?}: a path template is visible ASCII, without query, fragment, wildcard, percent-escape, ';' or backslash"
            ));
        }
        let trimmed = path
            .strip_suffix('/')
            .filter(|p| !p.is_empty())
            .unwrap_or(path);
        let mut segments = Vec::new();
        let mut names = Vec::new();
        for segment in trimmed.split('/').skip(1) {
            if segment.is_empty() && trimmed != "/" {
                return Err(format!("route {spec:?}: an empty segment ('//')"));
            }
            if matches!(segment, "." | "..") {
                return Err(format!("route {spec:?}: '.' and '..' are not segments"));
            }
            match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => {
                    let valid = !name.is_empty()
                        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                    if !valid {
                        return Err(format!(
                            "route {spec:?}: a parameter is {{name}}, letters, digits and _ only"
                        ));
                    }
                    if names.contains(&name) {
                        return Err(format!("route {spec:?}: {{{name}}} appears twice"));
                    }
                    names.push(name);
                    segments.push(Segment::Param);
                }
                None if segment.contains(['{', '}']) => {
                    return Err(format!(
                        "route {spec:?}: a parameter is a whole segment ({{name}})"
                    ));
                }
                None if !segment.is_empty() => {
                    segments.push(Segment::Literal(segment.to_ascii_lowercase()));
                }
                None => {}
            }
        }
        Ok(Self {
            method,
            template: trimmed.to_owned(),
            segments,
        })
    }

    /// The template, as given (without a trailing slash): the key's scope and metric label.
    pub fn template(&self) -> &str {
        &self.template
    }

    /// The method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Whether `other` matches exactly the requests this one does (`{id}` and `{n}` alike).
    pub fn same_as(&self, other: &Route) -> bool {
        self.method == other.method && self.segments == other.segments
    }

    /// Whether `method` and `path` are this route.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        method == self.method && self.matches_path(path)
    }

    /// Whether `path` is this route's, whatever the method.
    fn matches_path(&self, path: &str) -> bool {
        let path = path
            .strip_suffix('/')
            .filter(|p| !p.is_empty())
            .unwrap_or(path);
        let mut parts = path.split('/').skip(1).filter(|_| path != "/");
        let all = self
            .segments
            .iter()
            .all(|segment| match (segment, parts.next()) {
                (Segment::Literal(text), Some(part)) => part.eq_ignore_ascii_case(text),
                (Segment::Param, Some(part)) => !part.is_empty(),
                (_, None) => false,
            });
        all && parts.next().is_none()
    }

    /// Literal segments before parameters: the more specific route is tried first.
    fn specificity(&self) -> Vec<bool> {
        self.segments
            .iter()
            .map(|s| matches!(s, Segment::Literal(_)))
            .collect()
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.template)
    }
}

/// The protected routes, most specific first.
#[derive(Debug, Clone)]
pub struct Routes(Vec<Route>);

impl Routes {
    /// The routes of `--route` and `--routes-file` (its text): at least one, none twice.
    pub fn new(specs: &[String], file: Option<(&str, &str)>) -> Result<Self, String> {
        let mut routes: Vec<Route> = Vec::new();
        let mut add = |route: Route, origin: String| {
            if routes.iter().any(|r| r.same_as(&route)) {
                return Err(format!("{origin}: route {route} is named twice"));
            }
            routes.push(route);
            Ok(())
        };
        for spec in specs {
            add(Route::parse(spec)?, "--route".to_owned())?;
        }
        if let Some((name, text)) = file {
            for (n, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    continue;
                }
                let route = Route::parse(line).map_err(|e| format!("{name}:{}: {e}", n + 1))?;
                add(route, format!("{name}:{}", n + 1))?;
            }
        }
        if routes.is_empty() {
            return Err(
                "name at least one route to protect: --route 'POST /signup' (or --routes-file)"
                    .to_owned(),
            );
        }
        routes.sort_by_key(|r| std::cmp::Reverse(r.specificity()));
        Ok(Self(routes))
    }

    /// The protected route `method path` is, if any.
    pub fn matching(&self, method: &Method, path: &str) -> Option<&Route> {
        self.0.iter().find(|r| r.matches(method, path))
    }

    /// Whether some route is at `path`, whatever the method: where a request with another
    /// method could reach a protected route by naming that method.
    pub fn at_path(&self, path: &str) -> bool {
        self.0.iter().any(|r| r.matches_path(path))
    }

    /// Every route, most specific first.
    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.0.iter()
    }
}

/// Why a path is refused: an application could resolve it to another path than the one matched
/// here, so a protected route could be reached unprotected — `/a/../signup` is `/signup` to
/// some frameworks, `/sign%75p` is `/signup` to every one that decodes before routing (Flask,
/// Django, Go, Rails, Spring), `/signup;x=1` is `/signup` to Servlet containers. Every
/// percent-escape of an ASCII character is refused (no client needs one: templates are ASCII,
/// and `%2F` means another path to some and the same to others); escapes of non-ASCII bytes
/// (UTF-8 in a parameter) pass.
pub fn ambiguous(path: &str) -> Option<String> {
    if path.split('/').any(|s| s == "." || s == "..") {
        return Some("a '.' or '..' segment".to_owned());
    }
    let bytes = path.as_bytes();
    for (i, byte) in bytes.iter().enumerate() {
        if *byte != b'%' {
            continue;
        }
        let escape = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escape {
            None => return Some("a malformed percent-escape".to_owned()),
            Some(decoded) if decoded.is_ascii() => {
                return Some(format!(
                    "an escaped ASCII character (%{:02X}): send it as itself",
                    decoded
                ));
            }
            Some(_) => {}
        }
    }
    if path.contains(';') {
        return Some("a ';' (path parameters)".to_owned());
    }
    if path.contains('\\') {
        return Some("a backslash".to_owned());
    }
    if path.contains("//") {
        return Some("an empty segment ('//')".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(specs: &[&str]) -> Routes {
        Routes::new(
            &specs.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            None,
        )
        .unwrap()
    }

    #[test]
    fn templates_match_their_paths_only() {
        let r = routes(&["POST /signup", "post /orders/{id}/pay", "PUT /"]);
        let m = |method: Method, path: &str| r.matching(&method, path).map(|r| r.to_string());
        assert_eq!(m(Method::POST, "/signup").as_deref(), Some("POST /signup"));
        assert_eq!(m(Method::POST, "/SignUp/").as_deref(), Some("POST /signup"));
        assert_eq!(m(Method::GET, "/signup"), None);
        assert_eq!(m(Method::POST, "/signup/x"), None);
        assert_eq!(m(Method::POST, "/signups"), None);
        assert_eq!(
            m(Method::POST, "/orders/7/pay").as_deref(),
            Some("POST /orders/{id}/pay")
        );
        assert_eq!(m(Method::POST, "/orders//pay"), None);
        assert_eq!(m(Method::POST, "/orders/7"), None);
        assert_eq!(m(Method::PUT, "/").as_deref(), Some("PUT /"));
        assert_eq!(m(Method::PUT, "/x"), None);
    }

    #[test]
    fn a_literal_segment_wins_over_a_parameter() {
        let r = routes(&["POST /orders/{id}", "POST /orders/new"]);
        assert_eq!(
            r.matching(&Method::POST, "/orders/new").unwrap().template(),
            "/orders/new"
        );
        assert_eq!(
            r.matching(&Method::POST, "/orders/9").unwrap().template(),
            "/orders/{id}"
        );
    }

    #[test]
    fn bad_routes_are_refused_with_the_reason() {
        for (spec, says) in [
            ("/signup", "'METHOD /path'"),
            ("GET /signup", "safe method"),
            ("POST signup", "start with '/'"),
            ("POST /a?b=1", "without query"),
            ("POST /café", "visible ASCII"),
            ("POST /a;b", "';'"),
            ("POST /a/{}", "{name}"),
            ("POST /a/x{id}", "whole segment"),
            ("POST /a/{id}/{id}", "twice"),
            ("POST /a//b", "empty segment"),
            ("POST /a/../b", "'..'"),
            ("P@ST /a", "not an HTTP method"),
        ] {
            let error = Route::parse(spec).unwrap_err();
            assert!(error.contains(says), "{spec}: {error}");
        }
        let twice = Routes::new(&["POST /a".into(), "post /A/".into()], None).unwrap_err();
        assert!(twice.contains("twice"), "{twice}");
        assert!(Routes::new(&[], None).unwrap_err().contains("at least one"));
        let file = Routes::new(&[], Some(("routes.txt", "# mine\nPOST /a\n\nPOST b\n")));
        assert!(file.unwrap_err().starts_with("routes.txt:4:"));
    }

    #[test]
    fn paths_an_upstream_could_read_otherwise_are_ambiguous() {
        for path in [
            "/a/../signup",
            "/./signup",
            "/orders%2F1/pay",
            "/%2e%2e/signup",
            "/a\\b",
            "//signup",
            "/signup%00",
            "/sign%75p",
            "/or%64ers/7/pay",
            "/signup;x=1",
            "/signup%",
            "/signup%zz",
        ] {
            assert!(ambiguous(path).is_some(), "{path}");
        }
        for path in [
            "/signup",
            "/orders/1/pay",
            "/a.b/c..d",
            "/caf%C3%A9/pay",
            "/",
        ] {
            assert_eq!(ambiguous(path), None, "{path}");
        }
    }
}
