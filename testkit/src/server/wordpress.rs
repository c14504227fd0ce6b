//! A real WordPress of one owner (a test, or the `wordpress` binary of a
//! demo), built only from Debian's packages: `wordpress` (6.1, in
//! /usr/share/wordpress), `mariadb-server`, `php-cli` and `php-mysql`.
//! Slotgate publishes to WordPress over its REST API; these tests talk to
//! the real thing rather than a stand-in, so that what WordPress does with a
//! retried or unanswered write is WordPress's behaviour, not our guess.
//!
//! Each instance lives in a temp directory of its own:
//!
//! - `db/`: a private MariaDB (`mariadb-install-db`, then `mariadbd` on its
//!   own socket and a free port of 127.0.0.1, no systemd);
//! - `www/`: the docroot, symlinks to /usr/share/wordpress/* beside our own
//!   `wp-config.php` and `wp-content/` (Debian's wp-config.php reads
//!   /etc/wordpress, which is shared machine state), so plugins and
//!   must-use plugins are per instance; themes are Debian's, symlinked;
//! - `router.php`: the `php -S` router that gives pretty permalinks
//!   (`/%postname%/`, and so `/wp-json/wp/v2/posts`);
//! - `hold.json`, `held`: the control and the record of the hold fault
//!   ([`OwnedWordPress::hold_writes`]), read by a must-use plugin;
//! - `transitions.jsonl`: every status change of a post, written by a
//!   second must-use plugin ([`OwnedWordPress::transitions`]): WordPress's
//!   own account of what was published, and how often.
//!
//! WordPress is installed through its own PHP API (`wp_install`), with an
//! admin and a contributor, each with an application password made by
//! `WP_Application_Passwords` (available over plain HTTP because the
//! environment type is `local`). PHP's built-in server runs with
//! `PHP_CLI_SERVER_WORKERS=8`, so a held request does not block the others:
//! the WordPress chaos scenario holds up to 4 writes at once, and with only
//! 4 workers a write could wait at the server past the client's timeout
//! (invisible to the read-before-write that follows; docs/receivers.md).
//!
//! WordPress's pseudo-cron is off (`DISABLE_WP_CRON`): a `future` post stays
//! `future` past its date unless a client publishes it, so a test sees only
//! what its clients did. Outgoing HTTP to other hosts is blocked.

use super::{
    checked, find_exe, install, is_root, log_of, path_str, pick_port, temp_dir, ServerError,
    START_TRIES,
};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long MariaDB has to accept connections on its socket.
const DB_READY_WITHIN: Duration = Duration::from_secs(30);

/// How long `php -S` has to answer `/wp-json/` with the `wp/v2` namespace.
const WP_READY_WITHIN: Duration = Duration::from_secs(30);

/// Timeout of the REST helpers' requests: longer than any hold a test sets
/// (the helpers' writes are held like anyone's).
const REST_TIMEOUT: Duration = Duration::from_secs(60);

/// The Debian packages all this is built from.
const PACKAGES: &str = "wordpress mariadb-server php-cli php-mysql";

/// Where Debian's `wordpress` package puts WordPress.
const WORDPRESS: &str = "/usr/share/wordpress";

const ROUTER_PHP: &str = include_str!("wordpress/router.php");
const HOLD_PHP: &str = include_str!("wordpress/hold.php");
const LEDGER_PHP: &str = include_str!("wordpress/ledger.php");
const INSTALL_PHP: &str = include_str!("wordpress/install.php");

/// A running WordPress at `http://127.0.0.1:<port>`, with its own MariaDB;
/// both are killed and its directory removed on drop.
pub struct OwnedWordPress {
    dir: PathBuf,
    port: u16,
    admin: (String, String),
    contributor: (String, String),
    http: reqwest::Client,
    /// The `mariadb` client, for [`Self::posts`].
    client: PathBuf,
    /// `php -S` and its workers, once started.
    php: Option<Group>,
    mariadb: Group,
}

/// A row of WordPress's own posts table (`wp_posts`, post type `post`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WpPost {
    /// The post's id in WordPress.
    pub id: i64,
    /// `publish`, `future`, `draft`, `pending`, `private`, `trash`, …
    pub status: String,
    /// `post_name`: empty for a draft that never had one; a trashed post's
    /// ends in `__trashed`.
    pub slug: String,
    /// The post's title as WordPress stores it.
    pub title: String,
    /// `post_date_gmt` as stored: `YYYY-MM-DD HH:MM:SS`, or
    /// `0000-00-00 00:00:00` for a draft without a date.
    pub date_gmt: String,
    /// Computed, not fetched: `<url>/<slug>/`, the permalink a published
    /// post with this slug has, or `<url>/?p=<id>` for a post without a slug.
    pub link: String,
}

/// What a [`WpTransition`] line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WpOp {
    /// A save (`transition_post_status`), creations included.
    Save,
    /// A deletion for good.
    Delete,
    /// A REST read of this one post.
    Read,
}

/// One status change of a post, as WordPress's `transition_post_status`
/// saw it, a deletion for good (`to == "deleted"`), or a REST read of the
/// post (`from == to`, the status the reader saw).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct WpTransition {
    /// The post the change was made to.
    pub id: i64,
    /// Whether it was a save or a read.
    pub op: WpOp,
    /// The status before: `new` for a post being created.
    pub from: String,
    /// The status after; the same as `from` for a save that kept it.
    pub to: String,
    /// When, in microseconds since the Unix epoch (WordPress's clock).
    pub at: i64,
}

/// The programs an instance runs.
struct Tools {
    php: PathBuf,
    mariadbd: PathBuf,
    install_db: PathBuf,
    client: PathBuf,
}

impl Tools {
    /// All of them, or the names of what is missing.
    fn find() -> Result<Tools, Vec<&'static str>> {
        let php = find_exe(&["php"]);
        let mariadbd = find_exe(&["mariadbd", "mysqld"]);
        let install_db = find_exe(&["mariadb-install-db", "mysql_install_db"]);
        let client = find_exe(&["mariadb", "mysql"]);
        let mut missing = Vec::new();
        if !Path::new(WORDPRESS).join("wp-load.php").is_file() {
            missing.push("WordPress (/usr/share/wordpress)");
        }
        if mariadbd.is_none() || install_db.is_none() || client.is_none() {
            missing.push("MariaDB (mariadbd, mariadb-install-db, mariadb)");
        }
        match &php {
            None => missing.push("php"),
            Some(php) => {
                let mysqli = Command::new(php)
                    .args(["-r", "exit(extension_loaded('mysqli') ? 0 : 1);"])
                    .stdin(Stdio::null())
                    .output()
                    .is_ok_and(|o| o.status.success());
                if !mysqli {
                    missing.push("PHP's mysqli extension");
                }
            }
        }
        match (php, mariadbd, install_db, client) {
            (Some(php), Some(mariadbd), Some(install_db), Some(client)) if missing.is_empty() => {
                Ok(Tools {
                    php,
                    mariadbd,
                    install_db,
                    client,
                })
            }
            _ => Err(missing),
        }
    }

    /// All of them, installed first when missing and allowed.
    fn get() -> Result<Tools, ServerError> {
        let missing = match Tools::find() {
            Ok(t) => return Ok(t),
            Err(m) => m.join(", "),
        };
        install(&missing, PACKAGES)?;
        Tools::find().map_err(|m| ServerError::Missing {
            what: format!("{} after installing", m.join(", ")),
            package: PACKAGES.into(),
        })
    }
}

/// A child leading a process group of its own, killed as a group: `php -S`
/// forks its workers, and a worker asleep in a hold must go too.
struct Group {
    child: Child,
    done: bool,
}

impl Group {
    /// Starts `cmd` in a new process group, stdout and stderr to `log`.
    fn spawn(cmd: &mut Command, log: &Path) -> Result<Group, ServerError> {
        let out = std::fs::File::create(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()?;
        Ok(Group { child, done: false })
    }

    fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// SIGKILL to the whole group, then reaps the leader.
    fn kill(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `s` as a PHP single-quoted string literal.
fn php_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A random hex string, for WordPress's keys and salts.
fn random_key() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// A plain HTTP/1.0 GET of `path` on 127.0.0.1:`port`: (status, body).
/// Blocking, for [`OwnedWordPress::launch`], which runs outside a runtime.
fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    Ok(crate::status_and_body(&buf))
}

/// Does `/wp-json/` answer with the `wp/v2` namespace (WordPress, routed,
/// with its database)?
fn rest_is_up(port: u16) -> bool {
    let Ok((200, body)) = get(port, "/wp-json/") else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.get("namespaces")?
                .as_array()
                .map(|ns| ns.iter().any(|n| n == "wp/v2"))
        })
        .unwrap_or(false)
}

impl OwnedWordPress {
    /// Starts an instance; panics if it cannot (a test's set-up).
    pub fn start() -> OwnedWordPress {
        Self::launch().unwrap_or_else(|e| panic!("throwaway WordPress: {e}"))
    }

    /// Starts MariaDB, installs WordPress into it and serves it with
    /// `php -S`, each on a free port (another one if a bind lost a race);
    /// returns once `/wp-json/` answers with the `wp/v2` namespace.
    pub fn launch() -> Result<OwnedWordPress, ServerError> {
        let tools = Tools::get()?;
        let dir = temp_dir("wp")?;
        let mariadb = match start_mariadb(&tools, &dir) {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let http = reqwest::Client::builder()
            .timeout(REST_TIMEOUT)
            // A test may use this from more than one runtime.
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| ServerError::Step {
                step: "an HTTP client".into(),
                detail: e.to_string(),
            })?;
        // From here on, an error drops `wp`: servers killed, directory gone.
        let mut wp = OwnedWordPress {
            dir,
            port: pick_port(),
            admin: Default::default(),
            contributor: Default::default(),
            http,
            client: tools.client.clone(),
            php: None,
            mariadb,
        };
        checked(
            Command::new(&tools.client)
                .args(wp.client_args())
                .args(["-e", "CREATE DATABASE wordpress"]),
            "CREATE DATABASE wordpress",
        )?;
        wp.make_docroot()?;
        wp.write_config()?;
        wp.install(&tools)?;
        for attempt in 1..=START_TRIES {
            if attempt > 1 {
                wp.port = pick_port();
                wp.write_config()?;
            }
            wp.php = Some(wp.spawn_php(&tools)?);
            if wp.wait_php() {
                return Ok(wp);
            }
            wp.php = None;
        }
        Err(ServerError::Start {
            what: "php -S (WordPress)".into(),
            log: log_of(&wp.dir.join("php.log")),
        })
    }

    fn www(&self) -> PathBuf {
        self.dir.join("www")
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("mysql.sock")
    }

    /// Arguments of the `mariadb` client for this instance's database
    /// server, as root, over its socket, reading no option files.
    fn client_args(&self) -> Vec<String> {
        vec![
            "--no-defaults".into(),
            format!("--socket={}", self.socket().display()),
            "--user=root".into(),
            "--default-character-set=utf8mb4".into(),
        ]
    }

    /// The docroot: Debian's WordPress, symlinked, except `wp-config.php`
    /// (ours) and `wp-content` (ours: plugins, must-use plugins and uploads
    /// of this instance; Debian's themes). The router and the installer
    /// stay outside it.
    fn make_docroot(&self) -> Result<(), ServerError> {
        let www = self.www();
        let content = www.join("wp-content");
        for d in ["plugins", "mu-plugins", "uploads"] {
            std::fs::create_dir_all(content.join(d))?;
        }
        for entry in std::fs::read_dir(WORDPRESS)? {
            let entry = entry?;
            let name = entry.file_name();
            if name == "wp-config.php" || name == "wp-content" || name == ".htaccess" {
                continue;
            }
            std::os::unix::fs::symlink(entry.path(), www.join(&name))?;
        }
        std::os::unix::fs::symlink(
            Path::new(WORDPRESS).join("wp-content/themes"),
            content.join("themes"),
        )?;
        std::fs::write(content.join("mu-plugins/slotgate-hold.php"), HOLD_PHP)?;
        std::fs::write(content.join("mu-plugins/slotgate-ledger.php"), LEDGER_PHP)?;
        std::fs::write(self.dir.join("router.php"), ROUTER_PHP)?;
        std::fs::write(self.dir.join("install.php"), INSTALL_PHP)?;
        Ok(())
    }

    /// `wp-config.php`, for the current port: the site URL is a constant
    /// here (not only the `siteurl` option), so a new port after a lost
    /// bind race needs no database change.
    fn write_config(&self) -> Result<(), ServerError> {
        let url = self.url();
        let socket = format!("localhost:{}", self.socket().display());
        let content = self.www().join("wp-content");
        let mut consts = vec![
            ("DB_NAME", php_str("wordpress")),
            ("DB_USER", php_str("root")),
            ("DB_PASSWORD", php_str("")),
            ("DB_HOST", php_str(&socket)),
            ("DB_CHARSET", php_str("utf8mb4")),
            ("DB_COLLATE", php_str("")),
            ("WP_HOME", php_str(&url)),
            ("WP_SITEURL", php_str(&url)),
            ("WP_CONTENT_DIR", php_str(path_str(&content))),
            ("WP_CONTENT_URL", php_str(&format!("{url}/wp-content"))),
            // Application passwords over plain HTTP.
            ("WP_ENVIRONMENT_TYPE", php_str("local")),
            ("DISABLE_WP_CRON", "true".into()),
            ("AUTOMATIC_UPDATER_DISABLED", "true".into()),
            ("WP_HTTP_BLOCK_EXTERNAL", "true".into()),
            ("WP_DEBUG", "false".into()),
            // Where the hold plugin finds its control file.
            ("SLOTGATE_DIR", php_str(path_str(&self.dir))),
        ];
        for key in [
            "AUTH_KEY",
            "SECURE_AUTH_KEY",
            "LOGGED_IN_KEY",
            "NONCE_KEY",
            "AUTH_SALT",
            "SECURE_AUTH_SALT",
            "LOGGED_IN_SALT",
            "NONCE_SALT",
        ] {
            consts.push((key, php_str(&random_key())));
        }
        let mut text = String::from("<?php\n// Written by testkit::server::OwnedWordPress.\n");
        for (name, value) in consts {
            text.push_str(&format!("define('{name}', {value});\n"));
        }
        text.push_str(
            "$table_prefix = 'wp_';\n\
             if (!defined('ABSPATH')) {\n    define('ABSPATH', __DIR__ . '/');\n}\n\
             require_once ABSPATH . 'wp-settings.php';\n",
        );
        std::fs::write(self.www().join("wp-config.php"), text)?;
        Ok(())
    }

    /// Runs `install.php` (WordPress's own `wp_install`, users, application
    /// passwords) and keeps the credentials it prints.
    fn install(&mut self, tools: &Tools) -> Result<(), ServerError> {
        let out = Command::new(&tools.php)
            .args(["-d", "display_errors=stderr"])
            .arg(self.dir.join("install.php"))
            .arg(self.www())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let fail = |why: &str| ServerError::Step {
            step: "installing WordPress (install.php)".into(),
            detail: format!(
                "{why} ({}): {}\n{}",
                out.status,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        };
        if !out.status.success() {
            return Err(fail("failed"));
        }
        let users: serde_json::Value = stdout
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| fail("no JSON"))?;
        let cred = |role: &str| -> Option<(String, String)> {
            let u = users.get(role)?;
            Some((
                u.get("user")?.as_str()?.to_owned(),
                u.get("password")?.as_str()?.to_owned(),
            ))
        };
        self.admin = cred("admin").ok_or_else(|| fail("no admin"))?;
        self.contributor = cred("contributor").ok_or_else(|| fail("no contributor"))?;
        Ok(())
    }

    fn spawn_php(&self, tools: &Tools) -> Result<Group, ServerError> {
        Group::spawn(
            Command::new(&tools.php)
                .args(["-d", "display_errors=0", "-d", "log_errors=1", "-S"])
                .arg(format!("127.0.0.1:{}", self.port))
                .arg("-t")
                .arg(self.www())
                .arg(self.dir.join("router.php"))
                // Workers, so that a request held asleep blocks no other.
                .env("PHP_CLI_SERVER_WORKERS", "8")
                .current_dir(&self.dir),
            &self.dir.join("php.log"),
        )
    }

    /// Waits until our `php -S` (not another server on its port: ours must
    /// be running) serves the REST API; false if it exited or never did.
    fn wait_php(&mut self) -> bool {
        let Some(php) = self.php.as_mut() else {
            return false;
        };
        let deadline = Instant::now() + WP_READY_WITHIN;
        while Instant::now() < deadline {
            if php.exited() {
                return false;
            }
            if rest_is_up(self.port) {
                return !php.exited();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The site URL, `http://127.0.0.1:<port>` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The administrator: (user name, application password), for HTTP
    /// Basic auth against the REST API.
    pub fn admin(&self) -> (&str, &str) {
        (&self.admin.0, &self.admin.1)
    }

    /// A user with the `contributor` role (may write drafts, may not
    /// `publish_posts`): (user name, application password).
    pub fn contributor(&self) -> (&str, &str) {
        (&self.contributor.0, &self.contributor.1)
    }

    /// From now on, the next `count` REST creates or updates of a post are
    /// held `seconds` after WordPress saved them, before it answers ("the
    /// write applied, the answer was lost" for a client that times out
    /// sooner). The REST helpers below are held like any client. Set this
    /// before the writes it should catch: it replaces the control file
    /// while the plugin may be counting it down.
    pub fn hold_writes(&self, seconds: u64, count: u32) {
        self.hold(serde_json::json!({ "seconds": seconds, "count": count }));
    }

    /// From now on, the next `count` REST *creates* of a post wait
    /// `seconds` before WordPress saves them ("accepted, not yet saved": a
    /// client that times out sooner cannot see the post by any read, and
    /// PHP saves it afterwards all the same). Updates are not held.
    pub fn hold_creates_before_save(&self, seconds: u64, count: u32) {
        self.hold(serde_json::json!({
            "seconds": seconds, "count": count, "when": "before", "only": "create",
        }));
    }

    /// From now on, the next `count` REST *updates* of a post (a status
    /// change) are held `seconds` after WordPress saved them; creates are
    /// not held.
    pub fn hold_updates(&self, seconds: u64, count: u32) {
        self.hold(serde_json::json!({
            "seconds": seconds, "count": count, "when": "after", "only": "update",
        }));
    }

    /// Replaces the hold plugin's control file.
    fn hold(&self, control: serde_json::Value) {
        let tmp = self.dir.join("hold.json.rust");
        let text = control.to_string();
        std::fs::write(&tmp, text).expect("write hold.json");
        std::fs::rename(&tmp, self.dir.join("hold.json")).expect("rename hold.json");
    }

    /// No more holds (writes held already sleep on).
    pub fn release_holds(&self) {
        match std::fs::remove_file(self.dir.join("hold.json")) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove hold.json: {e}"),
        }
    }

    /// How many writes have been held so far (counted when a hold begins),
    /// so that a test can tell the fault happened.
    pub fn held_writes(&self) -> u32 {
        std::fs::read_to_string(self.dir.join("held"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Every status change and one-post REST read so far, in the order
    /// WordPress made them (creations included: `new -> draft`,
    /// `new -> publish`, …).
    pub fn transitions(&self) -> Vec<WpTransition> {
        let text = match std::fs::read_to_string(self.dir.join("transitions.jsonl")) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => panic!("read transitions.jsonl: {e}"),
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("transitions.jsonl: {e}: {l}"))
            })
            .collect()
    }

    /// A request to `/wp-json/wp/v2/<path>` as the administrator; panics
    /// unless it succeeds with a 2xx. Its JSON answer.
    async fn rest(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let admin = (self.admin.0.clone(), self.admin.1.clone());
        self.rest_as((&admin.0, &admin.1), method, path, body).await
    }

    /// [`OwnedWordPress::rest`] as `user` (name, application password).
    async fn rest_as(
        &self,
        user: (&str, &str),
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let url = format!("{}/wp-json/wp/v2/{path}", self.url());
        let mut req = self
            .http
            .request(method.clone(), &url)
            .basic_auth(user.0, Some(user.1));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "{method} {url}: {status} {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {url}: {e}: {text}"))
    }

    /// Creates a post through the REST API as the administrator (a
    /// `future` post needs a `date_gmt` ahead, `YYYY-MM-DDTHH:MM:SS`); its
    /// id. Panics unless WordPress answered 201.
    pub async fn create_post(&self, title: &str, status: &str, date_gmt: Option<&str>) -> i64 {
        let mut body = serde_json::json!({ "title": title, "status": status });
        if let Some(d) = date_gmt {
            body["date_gmt"] = d.into();
        }
        let post = self.rest(reqwest::Method::POST, "posts", Some(body)).await;
        post["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("a created post without an id: {post}"))
    }

    /// Creates a post through the REST API as `user` with this body
    /// (`title`, `status`, `slug`, …); its id.
    pub async fn create_post_as(&self, user: (&str, &str), body: serde_json::Value) -> i64 {
        let post = self
            .rest_as(user, reqwest::Method::POST, "posts", Some(body))
            .await;
        post["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("a created post without an id: {post}"))
    }

    /// Sets a post's status through the REST API as the administrator.
    pub async fn set_status(&self, id: i64, status: &str) {
        let body = serde_json::json!({ "status": status });
        self.rest(reqwest::Method::POST, &format!("posts/{id}"), Some(body))
            .await;
    }

    /// Moves a post to the trash (REST DELETE without `force`).
    pub async fn trash(&self, id: i64) {
        self.rest(reqwest::Method::DELETE, &format!("posts/{id}"), None)
            .await;
    }

    /// Deletes a post for good (REST DELETE with `force=true`).
    pub async fn delete(&self, id: i64) {
        self.rest(
            reqwest::Method::DELETE,
            &format!("posts/{id}?force=true"),
            None,
        )
        .await;
    }

    /// Every post in every status, trash included, by id, read from
    /// WordPress's own posts table with the `mariadb` client (the REST API
    /// hides trash and needs a status filter per status).
    pub async fn posts(&self) -> Vec<WpPost> {
        let sql = "SELECT JSON_OBJECT('id', ID, 'status', post_status, 'slug', post_name, \
                   'title', post_title, 'date_gmt', post_date_gmt) \
                   FROM wp_posts WHERE post_type = 'post' ORDER BY ID";
        let out = tokio::process::Command::new(&self.client)
            .args(self.client_args())
            .args([
                "--batch",
                "--raw",
                "--skip-column-names",
                "-e",
                sql,
                "wordpress",
            ])
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run the mariadb client");
        assert!(
            out.status.success(),
            "SELECT from wp_posts: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = self.url();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let v: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
                let s = |k: &str| match &v[k] {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let id = v["id"].as_i64().unwrap_or_else(|| panic!("no id: {line}"));
                let slug = s("slug");
                let link = if slug.is_empty() {
                    format!("{url}/?p={id}")
                } else {
                    format!("{url}/{slug}/")
                };
                WpPost {
                    id,
                    status: s("status"),
                    title: s("title"),
                    date_gmt: s("date_gmt"),
                    slug,
                    link,
                }
            })
            .collect()
    }
}

/// `mariadb-install-db`, then `mariadbd` on the socket `<dir>/mysql.sock`
/// and a free port of 127.0.0.1 (another if the bind lost a race), ready
/// for connections. Durability is not wanted of a server thrown away.
fn start_mariadb(tools: &Tools, dir: &Path) -> Result<Group, ServerError> {
    let data = dir.join("db");
    let mut init = Command::new(&tools.install_db);
    init.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        // Its bootstrap server's temporary tables in this instance's own
        // directory, not the shared /tmp: a test run starts many at once,
        // and one lost a temporary table there (CI, 2026-12-03).
        .arg(format!("--tmpdir={}", dir.display()))
        .args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
            "--innodb-log-file-size=8M",
        ])
        .current_dir(dir);
    if is_root() {
        init.arg("--user=root");
    }
    checked(&mut init, "mariadb-install-db")?;
    let socket = dir.join("mysql.sock");
    let log = dir.join("mariadb.log");
    for _ in 0..START_TRIES {
        let port = pick_port();
        let mut cmd = Command::new(&tools.mariadbd);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--tmpdir={}", dir.display()))
            .arg(format!("--port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-networking=0",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-log-file-size=8M",
                "--innodb-buffer-pool-size=32M",
                "--innodb-flush-log-at-trx-commit=0",
            ])
            .current_dir(dir);
        if is_root() {
            cmd.arg("--user=root");
        }
        let mut server = Group::spawn(&mut cmd, &dir.join("mariadbd.out"))?;
        let deadline = Instant::now() + DB_READY_WITHIN;
        while Instant::now() < deadline && !server.exited() {
            // The socket comes last, after the TCP port is bound.
            if std::os::unix::net::UnixStream::connect(&socket).is_ok()
                && log_of(&log).contains("ready for connections")
            {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        server.kill();
    }
    Err(ServerError::Start {
        what: "mariadbd".into(),
        log: format!("{}\n{}", log_of(&log), log_of(&dir.join("mariadbd.out"))),
    })
}

impl Drop for OwnedWordPress {
    fn drop(&mut self) {
        if let Some(php) = self.php.as_mut() {
            php.kill();
        }
        self.mariadb.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
