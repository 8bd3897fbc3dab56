use super::sessions::hex;
use super::*;
use crate::config::TokenConfig;

fn auth() -> Auth {
    let digest = hex(&Sha256::digest(b"s3cret"));
    Auth::new(&AuthConfig {
        tokens: vec![TokenConfig {
            name: "ops".into(),
            role: Role::Worker,
            sha256: digest,
        }],
        ..AuthConfig::default()
    })
}

#[test]
fn resolves_tokens_by_digest() {
    let a = auth();
    let c = a.resolve("s3cret").unwrap();
    assert_eq!(c.role, Role::Worker);
    assert!(a.resolve("s3cre").is_none());
    assert!(c.require(Role::Read).is_ok());
    assert!(c.require(Role::Admin).is_err());
}

#[test]
fn normalises_origins() {
    assert_eq!(normal_origin("HTTP", "Example.com:80"), "http://example.com");
    assert_eq!(normal_origin("https", "a:443"), "https://a");
    assert_eq!(normal_origin("http", "a:8080"), "http://a:8080");
    assert_ne!(normal_origin("http", "a:8080"), normal_origin("http", "a:8081"));
}

#[test]
fn decodes_query_tokens() {
    assert_eq!(query_token(Some("a=1&token=ab%2Fc")).as_deref(), Some("ab/c"));
    assert_eq!(query_token(Some("a=1")), None);
}
