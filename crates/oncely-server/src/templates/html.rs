//! Whether an email's HTML is well formed: no parse error of the HTML tokenizer (html5ever), every
//! element that is not void closed explicitly and in order, and no `<script>` (no mail client
//! runs one; spam filters count it against the sender). HTML parsers forgive all of these; mail
//! clients forgive them differently, so a template that relies on forgiveness looks right in one
//! client and broken in the next.

use std::cell::RefCell;

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{
    BufferQueue, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};

/// Where HTML is not well formed: the 1-based line and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed {
    /// The line (of the checked text).
    pub line: u64,
    /// What is wrong, in a sentence.
    pub reason: String,
}

/// Elements that have no content and no end tag.
const VOID: [&str; 13] = [
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr",
];

/// Checks `html`; the first problem found.
pub(crate) fn well_formed(html: &str) -> Result<(), Malformed> {
    let input = BufferQueue::default();
    input.push_back(StrTendril::from_slice(html));
    let opts = TokenizerOpts {
        exact_errors: true,
        ..TokenizerOpts::default()
    };
    let tokenizer = Tokenizer::new(Sink::default(), opts);
    let _ = tokenizer.feed(&input);
    tokenizer.end();
    let sink = tokenizer.sink;
    let state = sink.state.into_inner();
    match state.problem {
        Some(problem) => Err(problem),
        None => Ok(()),
    }
}

#[derive(Default)]
struct Sink {
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    /// The open elements and the line each opened on.
    open: Vec<(String, u64)>,
    problem: Option<Malformed>,
}

impl State {
    fn fail(&mut self, line: u64, reason: String) {
        if self.problem.is_none() {
            self.problem = Some(Malformed { line, reason });
        }
    }
}

impl TokenSink for Sink {
    type Handle = ();

    fn process_token(&self, token: Token, line: u64) -> TokenSinkResult<()> {
        let mut state = self.state.borrow_mut();
        if state.problem.is_some() {
            return TokenSinkResult::Continue;
        }
        match token {
            Token::ParseError(error) => state.fail(line, format!("HTML parse error: {error}")),
            Token::NullCharacterToken => state.fail(line, "a NUL character".into()),
            Token::TagToken(tag) => {
                let name = tag.name.to_string();
                let void = VOID.contains(&name.as_str());
                match tag.kind {
                    TagKind::StartTag if name == "script" => state.fail(
                        line,
                        "a <script> element: no mail client runs it, and spam filters count it against the sender".into(),
                    ),
                    TagKind::StartTag if void => {}
                    TagKind::StartTag if tag.self_closing => state.fail(
                        line,
                        format!("<{name}/> is not a void element: write <{name}></{name}>"),
                    ),
                    TagKind::StartTag => {
                        state.open.push((name.clone(), line));
                        match name.as_str() {
                            "style" => return TokenSinkResult::RawData(RawKind::Rawtext),
                            "title" | "textarea" => {
                                return TokenSinkResult::RawData(RawKind::Rcdata);
                            }
                            _ => {}
                        }
                    }
                    TagKind::EndTag if void => {
                        state.fail(line, format!("</{name}>: <{name}> is void, it has no end tag"));
                    }
                    TagKind::EndTag => match state.open.last() {
                        Some((top, _)) if *top == name => {
                            state.open.pop();
                        }
                        Some((top, opened)) if state.open.iter().any(|(n, _)| *n == name) => {
                            let reason = format!(
                                "</{name}> while <{top}> (opened on line {opened}) is still open"
                            );
                            state.fail(line, reason);
                        }
                        _ => state.fail(line, format!("</{name}> closes nothing: no <{name}> is open")),
                    },
                }
            }
            Token::EOFToken => {
                if let Some((name, opened)) = state.open.last().cloned() {
                    state.fail(opened, format!("<{name}> is never closed"));
                }
            }
            Token::DoctypeToken(_) | Token::CommentToken(_) | Token::CharacterTokens(_) => {}
        }
        TokenSinkResult::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_html_passes() {
        let html = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
                    <title>A &amp; B</title><style>p > a { color: red }</style></head>\n\
                    <body><p>Hello<br>there <img src=\"data:,\" alt=\"\"></p>\
                    <!-- a comment --><table><tr><td>1</td></tr></table></body></html>";
        assert_eq!(well_formed(html), Ok(()));
    }

    #[test]
    fn each_malformation_is_found_with_its_line() {
        let cases = [
            ("<p>\n<b>bold</p>", 2, "</p> while <b>"),
            ("<div>\n\n<p>open", 3, "<p> is never closed"),
            ("<p>one</p>\n</div>", 2, "</div> closes nothing"),
            ("<br></br>", 1, "void"),
            ("<div/>", 1, "not a void element"),
            ("<p>\n<script>alert(1)</script></p>", 2, "<script>"),
            ("<p class=\"a\"\"b\">x</p>", 1, "parse error"),
        ];
        for (html, line, reason) in cases {
            let problem = well_formed(html).unwrap_err();
            assert_eq!(problem.line, line, "{html:?}: {problem:?}");
            assert!(problem.reason.contains(reason), "{html:?}: {problem:?}");
        }
    }
}
