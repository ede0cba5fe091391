// Drives the npm `fq` client (0.4.1) against a broker: bind, consume, publish N, status.
// Usage: node npm_fq_roundtrip.js PORT COUNT EXCHANGE
// Prints one JSON object on stdout with what it saw; exits non-zero on any client error.
'use strict';
var FQ = require('fq');

var port = parseInt(process.argv[2], 10);
var count = parseInt(process.argv[3] || '1000', 10);
var exchange = process.argv[4] || 'npm-interop';

var consumer = new FQ({host: '127.0.0.1', port: port, user: 'npm-consumer', pass: 'x'});
var publisher = new FQ({host: '127.0.0.1', port: port, user: 'npm-publisher', pass: 'x'});
var received = [];
var bindResult = null;

function fail(where, err) {
  process.stderr.write('npm fq client error in ' + where + ': ' + (err && err.stack || err) + '\n');
  process.exit(2);
}
consumer.on('error', function (e) { fail('consumer', e); });
publisher.on('error', function (e) { fail('publisher', e); });

var timer = setTimeout(function () {
  fail('timeout', 'received ' + received.length + ' of ' + count);
}, 30000);

consumer.on('message', function (msg) {
  received.push({
    exchange: msg.getExchange(),
    route: msg.getRoute(),
    sender: msg.getSender(),
    hops: msg.getHops(),
    payload: msg.payload.toString('utf8'),
  });
  if (received.length === count) {
    consumer.status(function (err, status) {
      if (err) return fail('status', err);
      publisher.status(function (err2, pubStatus) {
        if (err2) return fail('publisher status', err2);
        clearTimeout(timer);
        consumer.shutdown();
        publisher.shutdown();
        // A pipe write is asynchronous: exit only once it is flushed.
        process.stdout.write(JSON.stringify({
          bind: bindResult, received: received, status: status, publisher_status: pubStatus,
        }) + '\n', function () { process.exit(0); });
      });
    });
  }
});

consumer.on('ready', function () {
  consumer.bind(exchange, 'prefix:"npm."', 0x100, function (err, res) {
    if (err) return fail('bind', err);
    bindResult = res;
    consumer.consume();
    publisher.connect();
  });
});

publisher.on('ready', function () {
  var i = 0;
  (function next() {
    if (i >= count) return;
    var n = i++;
    publisher.publish({
      route: 'npm.route.' + (n % 10), exchange: exchange, payload: 'message ' + n,
    }, function (err) {
      if (err) return fail('publish', err);
      setImmediate(next);
    });
  })();
});

consumer.connect();
