// Drives the npm `lumberjack-client` (1.0.3, v2: `2W(1)` + `2C{2J seq 1}` per log() call,
// plain TCP, never reads ACKs) against a broker's Lumberjack listener.
// Usage: node lumberjack_client_send.js PORT COUNT
// It logs COUNT events, prints "sent N" on stdout once the socket has flushed them, and
// stays connected until its stdin closes (so the broker never sees an early close).
'use strict';
var LumberjackClient = require('lumberjack-client');

var port = parseInt(process.argv[2], 10);
var count = parseInt(process.argv[3] || '100', 10);

var client = new LumberjackClient({host: '127.0.0.1', port: port});
for (var i = 1; i <= count; i++) {
  // Queued until the socket connects, then written as one W+C per event.
  client.log({message: 'event ' + i, n: i, fields: {type: 'nodeapp'}, nested: {a: [1, 'b']}});
}

var timer = setTimeout(function () {
  process.stderr.write('lumberjack-client: timeout before the events were written\n');
  process.exit(3);
}, 30000);

(function waitFlushed() {
  var s = client.socket;
  if (client.connected && s && s.writableLength === 0) {
    clearTimeout(timer);
    process.stdout.write('sent ' + count + '\n');
    return;
  }
  setTimeout(waitFlushed, 10);
})();

process.stdin.on('data', function () {});
process.stdin.on('end', function () {
  if (client.socket) client.socket.destroy();
  process.exit(0);
});
