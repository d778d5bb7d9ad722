// A deliberately non-idempotent Express application: every POST /signup inserts a row and
// "sends" an email (appends a line to a file). Run alone, a retried or concurrent signup makes
// two rows and two emails; behind `oncely gateway` it makes one. See README.md.
'use strict';

const express = require('express');
const methodOverride = require('method-override');
const fs = require('node:fs');
const path = require('node:path');

const port = Number(process.env.PORT || 3000);
const dataDir = process.env.DATA_DIR || __dirname;
const rowsFile = path.join(dataDir, 'users.jsonl');
const emailsFile = path.join(dataDir, 'emails.log');

const app = express();
app.use(express.json());
app.use(express.urlencoded({ extended: false }));
// Method overrides, as apps with HTML forms configure them: a POST becomes the method named in
// a header (the first of comma-separated values), a `_method` query parameter (decoded), or a
// form field. The gateway must not let any of them reach a protected route unprotected.
app.use(methodOverride('X-HTTP-Method-Override'));
app.use(methodOverride('X-HTTP-Method'));
app.use(methodOverride('_method'));
app.use(
  methodOverride((req) => {
    const method = req.body && req.body._method;
    if (typeof method === 'string') {
      delete req.body._method;
      return method;
    }
    return undefined;
  }),
);

let nextId = 1;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const lines = (file) =>
  fs.existsSync(file) ? fs.readFileSync(file, 'utf8').split('\n').filter(Boolean) : [];

app.post('/signup', async (req, res) => {
  const { email, delay_ms: delayMs = 0 } = req.body || {};
  if (typeof email !== 'string' || !email.includes('@')) {
    return res.status(400).json({ error: 'email required' });
  }
  // The effect: a row (no uniqueness check: a second call is a second account) ...
  const id = nextId++;
  const key = req.get('Idempotency-Key') || null;
  fs.appendFileSync(rowsFile, JSON.stringify({ id, email, key }) + '\n');
  // ... a pause in which a concurrent duplicate gets in ...
  await sleep(20 + Number(delayMs));
  // ... and an email.
  fs.appendFileSync(emailsFile, `to=${email} id=${id} key=${key}\n`);
  res.cookie('session', `s-${id}`, { httpOnly: true });
  res.status(201).location(`/users/${id}`).json({ id, email });
});

// An update that is not idempotent either: each PUT appends a line ("charges" the order again).
const ordersFile = path.join(dataDir, 'orders.log');
app.put('/orders/:id', (req, res) => {
  fs.appendFileSync(ordersFile, `order=${req.params.id} via=${req.originalMethod}\n`);
  res.json({ id: req.params.id, updates: lines(ordersFile).length });
});

// The probe `oncely check --probe` reads: it changes whenever a signup runs.
app.get('/count', (req, res) => {
  res.json({
    rows: lines(rowsFile).length,
    emails: lines(emailsFile).length,
    order_updates: lines(ordersFile).length,
  });
});

// What the application received: for tests of the gateway's forwarding.
app.post('/echo', (req, res) => {
  res.json({ headers: req.headers, body: req.body, url: req.originalUrl });
});

app.get('/hello', (req, res) => {
  res.type('text').send(`hello from express, ${req.get('x-forwarded-for') || 'direct'}\n`);
});

// PORT=0: any free port; the first line printed names it.
const server = app.listen(port, '127.0.0.1', () => {
  console.log(`express-signup listening on http://127.0.0.1:${server.address().port}`);
});
