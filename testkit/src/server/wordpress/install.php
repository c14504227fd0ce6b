<?php
// Installs a throwaway WordPress (testkit::server::OwnedWordPress) through
// WordPress's own PHP API: `php install.php <docroot>`, the docroot's
// wp-config.php naming an empty database. Prints one line of JSON: the
// users' names and application passwords.
if ($argc !== 2) {
    fwrite(STDERR, "usage: php install.php DOCROOT\n");
    exit(2);
}
define('ABSPATH', rtrim($argv[1], '/') . '/');
define('WP_INSTALLING', true);

// Pluggable: no "your new site" mail.
function wp_new_blog_notification()
{
}

require ABSPATH . 'wp-load.php';
// wp_install() probes the (not yet running) site over HTTP for pretty
// permalinks; they are set below instead.
add_filter('pre_http_request', function () {
    return new WP_Error('offline', 'no HTTP while installing');
});
require_once ABSPATH . 'wp-admin/includes/upgrade.php';

function fail($what, $error)
{
    fwrite(STDERR, $what . ': ' . (is_wp_error($error) ? $error->get_error_message() : var_export($error, true)) . "\n");
    exit(1);
}

$installed = wp_install('slotgate test', 'admin', 'admin@example.test', false, '', wp_generate_password(32, false));
$admin = (int) $installed['user_id'];
if ($admin <= 0) {
    fail('wp_install', $installed);
}
$GLOBALS['wp_rewrite']->set_permalink_structure('/%postname%/');

// Tests count the posts they made: the sample "Hello world!" goes.
$samples = get_posts(['post_type' => 'post', 'post_status' => 'any', 'numberposts' => -1, 'fields' => 'ids']);
foreach ($samples as $id) {
    wp_delete_post($id, true);
}

$contributor = wp_insert_user([
    'user_login' => 'contributor',
    'user_pass' => wp_generate_password(32, false),
    'user_email' => 'contributor@example.test',
    'role' => 'contributor',
]);
if (is_wp_error($contributor)) {
    fail('wp_insert_user', $contributor);
}

if (!wp_is_application_passwords_available()) {
    fail('application passwords', 'not available (WP_ENVIRONMENT_TYPE must be local)');
}
$users = [];
foreach (['admin' => $admin, 'contributor' => $contributor] as $role => $id) {
    $created = WP_Application_Passwords::create_new_application_password($id, ['name' => 'slotgate tests']);
    if (is_wp_error($created)) {
        fail("application password of $role", $created);
    }
    $users[$role] = ['user' => get_userdata($id)->user_login, 'password' => $created[0]];
}
echo json_encode($users), "\n";
