//! The service end to end: real HTTP, real SMTP into the test inbox, PostgreSQL and SQLite.

#![allow(unreachable_pub)]

mod api_description;
mod flows;
mod health;
mod ops;
mod signup;
mod support;
