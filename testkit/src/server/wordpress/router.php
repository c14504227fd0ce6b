<?php
// The `php -S` router of a throwaway WordPress (testkit::server::OwnedWordPress):
// pretty permalinks without a web server's rewrite rules. A file that exists
// is served as-is (`return false`); anything else goes to WordPress's
// index.php, which routes /wp-json/... and /<slug>/ itself.
//
// ABSPATH is the instance's docroot, a directory of symlinks into
// /usr/share/wordpress: PHP resolves symlinks in __DIR__, so without this
// WordPress would take /usr/share/wordpress for its root and load Debian's
// wp-config.php (which wants /etc/wordpress/config-<host>.php). The constant
// stays defined for a .php file the server runs after `return false`.
if (!defined('ABSPATH')) {
    define('ABSPATH', $_SERVER['DOCUMENT_ROOT'] . '/');
}
$path = urldecode((string) parse_url($_SERVER['REQUEST_URI'], PHP_URL_PATH));
if ($path !== '/' && file_exists($_SERVER['DOCUMENT_ROOT'] . $path)) {
    return false;
}
$_SERVER['SCRIPT_NAME'] = '/index.php';
$_SERVER['PHP_SELF'] = '/index.php';
$_SERVER['SCRIPT_FILENAME'] = ABSPATH . 'index.php';
require ABSPATH . 'index.php';
