<?php
// The seed's design, built literally, in the PHP it was sketched in: the
// `php -S` built-in server (one request at a time) and SQLite.
//
//     SEED_DB=/tmp/seed.sqlite php -S 127.0.0.1:PORT seed.php
//
// POST /orders takes {"item", "quantity", "price"} and answers 201 with an
// integer id; GET /orders lists every order, GET /orders/{id} reads one.
// As the seed does it: no authentication, one key space for everyone, a
// missing or blank Idempotency-Key is 422, a known key replays its first
// answer (201) whatever the body, keys of any length, no PATCH or DELETE.
// The body is validated strictly (integer quantity >= 1, numeric price >= 0,
// a non-empty item).

$db = new PDO('sqlite:' . getenv('SEED_DB'));
$db->setAttribute(PDO::ATTR_ERRMODE, PDO::ERRMODE_EXCEPTION);
$db->exec('CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT, quantity INTEGER, price TEXT)');
$db->exec('CREATE TABLE IF NOT EXISTS idempotency_keys (key TEXT PRIMARY KEY, status INTEGER, body TEXT, location TEXT)');

function answer(int $status, $body, ?string $location = null): void
{
    http_response_code($status);
    header('Content-Type: application/json');
    if ($location !== null) {
        header("Location: $location");
    }
    echo is_string($body) ? $body : json_encode($body);
}

function order_json(array $row): string
{
    // The price as it was sent (a JSON number's text), the rest as stored.
    return sprintf('{"id":%d,"item":%s,"quantity":%d,"price":%s}',
        $row['id'], json_encode($row['item']), $row['quantity'], $row['price']);
}

$method = $_SERVER['REQUEST_METHOD'];
$path = parse_url($_SERVER['REQUEST_URI'], PHP_URL_PATH);

if ($path === '/orders' && $method === 'POST') {
    $key = $_SERVER['HTTP_IDEMPOTENCY_KEY'] ?? '';
    if (trim($key) === '') {
        answer(422, ['error' => 'Idempotency-Key header is required']);
        return;
    }
    $known = $db->prepare('SELECT status, body, location FROM idempotency_keys WHERE key = ?');
    $known->execute([$key]);
    if ($first = $known->fetch(PDO::FETCH_ASSOC)) {
        answer((int) $first['status'], $first['body'], $first['location']);
        return;
    }
    if (strpos($_SERVER['CONTENT_TYPE'] ?? '', 'application/json') !== 0) {
        answer(400, ['error' => 'Content-Type must be application/json']);
        return;
    }
    $raw = file_get_contents('php://input');
    $body = json_decode($raw, true);
    if (!is_array($body)) {
        answer(400, ['error' => 'Invalid JSON']);
        return;
    }
    $errors = [];
    $item = $body['item'] ?? null;
    if (!is_string($item) || trim($item) === '') {
        $errors[] = 'item is required';
    }
    $quantity = $body['quantity'] ?? null;
    if (!is_int($quantity) || $quantity < 1) {
        $errors[] = 'quantity must be a positive integer';
    }
    $price = $body['price'] ?? null;
    if (!(is_int($price) || is_float($price)) || $price < 0) {
        $errors[] = 'price must be a number >= 0';
    }
    if ($errors) {
        answer(422, ['errors' => $errors]);
        return;
    }
    usleep(1000 * (int) (getenv('FIELD_CREATE_MS') ?: 50)); // a create's work, as in the other apps
    $insert = $db->prepare('INSERT INTO orders (item, quantity, price) VALUES (?, ?, ?)');
    $insert->execute([$item, $quantity, json_encode($price)]);
    $id = (int) $db->lastInsertId();
    $created = order_json(['id' => $id, 'item' => $item, 'quantity' => $quantity, 'price' => json_encode($price)]);
    $db->prepare('INSERT INTO idempotency_keys (key, status, body, location) VALUES (?, 201, ?, ?)')
        ->execute([$key, $created, "/orders/$id"]);
    answer(201, $created, "/orders/$id");
    return;
}
if ($path === '/orders' && $method === 'GET') {
    $rows = $db->query('SELECT * FROM orders ORDER BY id')->fetchAll(PDO::FETCH_ASSOC);
    answer(200, '[' . implode(',', array_map('order_json', $rows)) . ']');
    return;
}
if (preg_match('#^/orders/([^/]+)$#', $path, $m)) {
    if ($method !== 'GET') {
        answer(405, ['error' => 'Method not allowed']);
        return;
    }
    $one = $db->prepare('SELECT * FROM orders WHERE id = ?');
    $one->execute([$m[1]]);
    $row = $one->fetch(PDO::FETCH_ASSOC);
    if ($row) {
        answer(200, order_json($row));
    } else {
        answer(404, ['error' => 'Order not found']);
    }
    return;
}
if ($path === '/orders') {
    answer(405, ['error' => 'Method not allowed']);
    return;
}
answer(404, ['error' => 'Not found']);
