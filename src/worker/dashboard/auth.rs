//! Who may act on the dashboard. Read-only for everyone unless `dashboard.admin_token` is
//! set; an admin is a visitor who gave the token, either at `POST /login` (which sets a
//! session cookie) or as `Authorization: Bearer <token>` (API clients).
//!
//! [`Admin`] is the extractor every action handler takes: the handler runs only for an admin
//! whose request did not come from another site, and the refusal ([`Refused`]) is its own
//! response. [`Viewer`] tells a page whether to show the admin's buttons.

use super::super::listener::cross_site;
use super::actions::{back, ActionForm, Done};
use axum::extract::{FromRef, FromRequestParts, State};
use axum::http::{header, request::Parts, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use serde::Deserialize;
use std::convert::Infallible;
use std::sync::Arc;
use tracing::warn;

/// The session cookie's name.
pub(super) const COOKIE: &str = "jobwarden_admin";

/// The admin tokens, each with its name and the session cookie's value made of it (once, at
/// start-up).
#[derive(Clone)]
pub(super) struct Auth {
    tokens: Arc<[Named]>,
}

struct Named {
    name: Arc<str>,
    token: Box<str>,
    session: Box<str>,
}

impl Auth {
    /// `tokens`: (name, token), as [`crate::config::DashboardConfig::named_admin_tokens`].
    pub(super) fn new(tokens: &[(&str, &str)]) -> Auth {
        Auth {
            tokens: tokens
                .iter()
                .map(|(n, t)| Named {
                    name: Arc::from(*n),
                    token: Box::from(*t),
                    session: session(t).into_boxed_str(),
                })
                .collect(),
        }
    }

    /// Is a token configured at all (without one the dashboard is read-only)?
    fn configured(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The name of the token this request brought (as a bearer) or whose session cookie it
    /// brought. Every token is compared, matched or not.
    fn admits(&self, headers: &HeaderMap) -> Option<Arc<str>> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let jar = CookieJar::from_headers(headers);
        let cookie = jar.get(COOKIE).map(|c| c.value());
        let mut found = None;
        for t in self.tokens.iter() {
            let by_bearer = bearer.is_some_and(|b| same(b.as_bytes(), t.token.as_bytes()));
            let by_cookie = cookie.is_some_and(|c| same(c.as_bytes(), t.session.as_bytes()));
            if (by_bearer || by_cookie) && found.is_none() {
                found = Some(t.name.clone());
            }
        }
        found
    }
}

/// The cookie an admin gets: a digest of the token, so the token itself never travels in
/// cookies (which every service on the same host would receive).
fn session(token: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(format!("jobwarden dashboard session\n{token}").as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Who looks at a page: whether to show the admin's buttons, and which form the header has
/// (log in, log out, or none when no token is configured). Never refuses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Viewer {
    pub admin: bool,
    /// A token is configured: a visitor may log in.
    pub can_log_in: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for Viewer
where
    Auth: FromRef<S>,
{
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Infallible> {
        let auth = Auth::from_ref(state);
        Ok(Viewer {
            admin: auth.admits(&parts.headers).is_some(),
            can_log_in: auth.configured(),
        })
    }
}

/// An admin's request from this dashboard's own pages (or from a program): taken by every
/// handler that changes something. Holds the name of the admin's token.
#[derive(Debug)]
pub(super) struct Admin(pub Arc<str>);

impl Admin {
    /// Who acted, as recorded: `dashboard:<token name>`.
    pub(super) fn who(&self) -> String {
        format!("dashboard:{}", self.0)
    }
}

/// Why an action was refused (`403`, saying why).
#[derive(Debug, PartialEq)]
pub(super) enum Refused {
    /// No `dashboard.admin_token` is configured.
    ReadOnly,
    /// A token is configured, and this visitor did not give it.
    NotLoggedIn,
    /// An admin's browser sent it from another site (SameSite cookies count every port of a
    /// host and every sibling subdomain as the same site, so the origin is checked too).
    CrossSite(String),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let why = match self {
            Refused::ReadOnly => "this dashboard is read-only: set dashboard.admin_token to allow retry, discard and cancel".to_string(),
            Refused::NotLoggedIn => "log in with the admin token first".to_string(),
            Refused::CrossSite(why) => format!("refused: the request came from another site ({why})"),
        };
        (StatusCode::FORBIDDEN, why).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Admin
where
    Auth: FromRef<S>,
{
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Refused> {
        let auth = Auth::from_ref(state);
        let Some(name) = auth.admits(&parts.headers) else {
            return Err(if auth.configured() {
                Refused::NotLoggedIn
            } else {
                Refused::ReadOnly
            });
        };
        if let Some(why) = cross_site(&parts.headers) {
            warn!(%why, "dashboard: an action from another site was refused");
            return Err(Refused::CrossSite(why));
        }
        Ok(Admin(name))
    }
}

/// The login form.
#[derive(Deserialize)]
pub(super) struct Login {
    #[serde(default)]
    token: String,
}

/// The session cookie with every attribute it always has: HttpOnly (no script reads it),
/// SameSite=Strict (no other site's page sends it), for every path.
fn session_cookie(value: String) -> Cookie<'static> {
    Cookie::build((COOKIE, value))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .build()
}

/// `POST /login`: a session cookie for the right token, the overview either way.
pub(super) async fn login(
    State(auth): State<Auth>,
    jar: CookieJar,
    ActionForm(form): ActionForm<Login>,
) -> Response {
    let mut found = None;
    for t in auth.tokens.iter() {
        if same(form.token.as_bytes(), t.token.as_bytes()) && found.is_none() {
            found = Some(t);
        }
    }
    match found {
        Some(t) => {
            let jar = jar.add(session_cookie(t.session.to_string()));
            (jar, Redirect::to("/")).into_response()
        }
        None => {
            warn!("dashboard: a login with a wrong admin token");
            back("/", Done::WrongToken, 0)
        }
    }
}

/// `POST /logout`: the session cookie expired, whether or not the request had one.
pub(super) async fn logout(jar: CookieJar) -> (CookieJar, Redirect) {
    let mut gone = session_cookie(String::new());
    gone.make_removal();
    (jar.add(gone), Redirect::to("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    const TOKEN: &str = "0123456789abcdef-token";

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut r = Request::builder().method("POST").uri("/dead/retry");
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.body(()).unwrap().into_parts().0
    }

    async fn admin(auth: &Auth, headers: &[(&str, &str)]) -> Result<(), Refused> {
        Admin::from_request_parts(&mut parts(headers), auth)
            .await
            .map(|_| ())
    }

    #[tokio::test]
    async fn each_named_token_admits_under_its_own_name() {
        const OTHER: &str = "fedcba9876543210-other";
        let auth = Auth::new(&[("admin", TOKEN), ("alice", OTHER)]);
        let name = |h: &'static str| {
            let auth = auth.clone();
            async move {
                Admin::from_request_parts(&mut parts(&[("authorization", h)]), &auth)
                    .await
                    .map(|a| a.who())
            }
        };
        assert_eq!(
            name("Bearer fedcba9876543210-other").await.unwrap(),
            "dashboard:alice"
        );
        assert_eq!(
            name("Bearer 0123456789abcdef-token").await.unwrap(),
            "dashboard:admin"
        );
        let cookie = format!("{COOKIE}={}", session(OTHER));
        let a = Admin::from_request_parts(&mut parts(&[("cookie", &cookie)]), &auth)
            .await
            .unwrap();
        assert_eq!(a.who(), "dashboard:alice");
        assert_eq!(
            name("Bearer fedcba9876543210-othe").await.unwrap_err(),
            Refused::NotLoggedIn
        );
    }

    #[tokio::test]
    async fn without_a_token_every_action_is_refused_as_read_only() {
        let auth = Auth::new(&[]);
        let bearer = format!("Bearer {TOKEN}");
        assert_eq!(admin(&auth, &[]).await, Err(Refused::ReadOnly));
        assert_eq!(
            admin(&auth, &[("authorization", &bearer)]).await,
            Err(Refused::ReadOnly)
        );
        let r = Refused::ReadOnly.into_response();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }

    #[tokio::test]
    async fn an_admin_is_one_who_gave_the_token_or_its_session() {
        let auth = Auth::new(&[("admin", TOKEN)]);
        let bearer = format!("Bearer {TOKEN}");
        let cookie = format!("other=1; {COOKIE}={}", session(TOKEN));
        assert_eq!(admin(&auth, &[("authorization", &bearer)]).await, Ok(()));
        assert_eq!(admin(&auth, &[("cookie", &cookie)]).await, Ok(()));
        for wrong in [
            vec![],
            vec![("authorization", "Bearer 0123456789abcdef-tokeN")],
            vec![("authorization", TOKEN)],
            // The token itself is not a session: only its digest is.
            vec![("cookie", "jobwarden_admin=0123456789abcdef-token")],
        ] {
            assert_eq!(
                admin(&auth, &wrong).await,
                Err(Refused::NotLoggedIn),
                "{wrong:?}"
            );
        }
    }

    #[tokio::test]
    async fn an_admins_request_from_another_site_is_refused() {
        let auth = Auth::new(&[("admin", TOKEN)]);
        let bearer = format!("Bearer {TOKEN}");
        for (origin, refused) in [
            ("http://127.0.0.1:7433", false),
            ("http://127.0.0.1:3000", true),
            ("https://evil.example", true),
        ] {
            let h = [
                ("authorization", bearer.as_str()),
                ("host", "127.0.0.1:7433"),
                ("origin", origin),
            ];
            let got = admin(&auth, &h).await;
            assert_eq!(got.is_err(), refused, "{origin}: {got:?}");
            if let Err(why) = got {
                assert!(matches!(why, Refused::CrossSite(_)), "{why:?}");
                let r = why.into_response();
                assert_eq!(r.status(), StatusCode::FORBIDDEN);
            }
        }
        let site = [
            ("authorization", bearer.as_str()),
            ("sec-fetch-site", "same-site"),
        ];
        assert!(matches!(
            admin(&auth, &site).await,
            Err(Refused::CrossSite(_))
        ));
    }

    #[tokio::test]
    async fn the_viewer_is_told_whether_to_show_the_admins_buttons() {
        let view = |auth: Auth, h: &'static [(&'static str, &'static str)]| async move {
            Viewer::from_request_parts(&mut parts(h), &auth)
                .await
                .unwrap()
        };
        let guest = view(Auth::new(&[("admin", TOKEN)]), &[]).await;
        assert_eq!(
            guest,
            Viewer {
                admin: false,
                can_log_in: true
            }
        );
        let off = view(Auth::new(&[]), &[]).await;
        assert_eq!(
            off,
            Viewer {
                admin: false,
                can_log_in: false
            }
        );
    }

    #[test]
    fn the_session_cookie_keeps_its_attributes_and_is_not_the_token() {
        let c = session_cookie(session(TOKEN)).to_string();
        assert!(!c.contains(TOKEN), "{c}");
        for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
            assert!(c.contains(attr), "{attr} missing: {c}");
        }
        let mut gone = session_cookie(String::new());
        gone.make_removal();
        let gone = gone.to_string();
        assert!(
            gone.contains("Max-Age=0") && gone.contains("HttpOnly"),
            "{gone}"
        );
    }

    #[tokio::test]
    async fn each_refusal_is_a_403_that_says_why() {
        for (refused, says) in [
            (
                Refused::ReadOnly,
                "this dashboard is read-only: set dashboard.admin_token to allow retry, discard and cancel",
            ),
            (Refused::NotLoggedIn, "log in with the admin token first"),
            (
                Refused::CrossSite("Sec-Fetch-Site is cross-site".into()),
                "refused: the request came from another site (Sec-Fetch-Site is cross-site)",
            ),
        ] {
            let r = refused.into_response();
            assert_eq!(r.status(), StatusCode::FORBIDDEN);
            let body = axum::body::to_bytes(r.into_body(), 1024).await.unwrap();
            assert_eq!(std::str::from_utf8(&body).unwrap(), says);
        }
    }

    #[test]
    fn token_comparison_needs_every_byte() {
        assert!(same(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcdeg"));
        assert!(!same(b"short", b"0123456789abcdef"));
    }
}
