// Drives the npm `fq` client (0.4.1) against a broker with auth = "password".
// Usage: node npm_fq_auth.js PORT USER PASS COUNT EXCHANGE
// With the right password: a consumer and a publisher log in as USER, bind, publish COUNT
// and read them back; prints {"bind": ROUTE_ID, "received": N}. With a wrong one: prints
// {"error": MESSAGE} of the first error the client reports. Exits non-zero on anything else.
'use strict';
var FQ = require('fq');

var port = parseInt(process.argv[2], 10);
var user = process.argv[3];
var pass = process.argv[4];
var count = parseInt(process.argv[5] || '10', 10);
var exchange = process.argv[6] || 'npm-auth';

// reconnect: the client retries a refused login forever; the first error is the answer.
var consumer = new FQ({host: '127.0.0.1', port: port, user: user, pass: pass});
var publisher = new FQ({host: '127.0.0.1', port: port, user: user, pass: pass});
var received = 0;
var bindResult = null;

function done(result) {
  consumer.shutdown();
  publisher.shutdown();
  process.stdout.write(JSON.stringify(result) + '\n', function () { process.exit(0); });
}
function onError(e) { done({error: e && e.message || String(e)}); }
consumer.on('error', onError);
publisher.on('error', onError);

setTimeout(function () {
  process.stderr.write('timeout: received ' + received + ' of ' + count + '\n');
  process.exit(2);
}, 30000);

consumer.on('message', function () {
  received += 1;
  if (received === count) done({bind: bindResult, received: received});
});

consumer.on('ready', function () {
  consumer.bind(exchange, 'prefix:""', 0x100, function (err, res) {
    if (err) return onError(err);
    bindResult = res;
    consumer.consume();
    publisher.connect();
  });
});

publisher.on('ready', function () {
  for (var n = 0; n < count; n++) {
    publisher.publish({route: 'r', exchange: exchange, payload: 'm ' + n}, function () {});
  }
});

consumer.connect();
