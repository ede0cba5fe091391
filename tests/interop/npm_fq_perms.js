// Drives the npm `fq` client (0.4.1) as a user with few rights (auth = "password").
// Usage: node npm_fq_perms.js PORT USER PASS QUEUE BIND_EXCHANGE PUBLISH_EXCHANGE COUNT
// Logs in on QUEUE, binds on BIND_EXCHANGE and prints {"bind": ROUTE_ID} (the client reads
// the route id as a signed int: fq's bind failure 0xffffffff is -1), then publishes COUNT
// messages to PUBLISH_EXCHANGE and stays connected until killed, so the broker's counters
// can be read. A login error prints {"error": MESSAGE}. Exits non-zero after 30 s.
'use strict';
var FQ = require('fq');

var argv = process.argv;
var client = new FQ({host: '127.0.0.1', port: parseInt(argv[2], 10), user: argv[3],
                     pass: argv[4], queue: argv[5]});
var count = parseInt(argv[8], 10);

setTimeout(function () { process.exit(2); }, 30000);
client.on('error', function (e) {
  process.stdout.write(JSON.stringify({error: e && e.message || String(e)}) + '\n',
                       function () { process.exit(0); });
});
client.on('ready', function () {
  client.bind(argv[6], 'prefix:""', 0x100, function (err, res) {
    if (err) { process.stderr.write(String(err) + '\n'); process.exit(1); }
    process.stdout.write(JSON.stringify({bind: res}) + '\n');
    for (var n = 0; n < count; n++) {
      client.publish({route: 'r', exchange: argv[7], payload: 'm ' + n}, function () {});
    }
  });
});
client.connect();
