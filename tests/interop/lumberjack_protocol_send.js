// Drives the npm `lumberjack-protocol` client (1.0.7, v1 `D` frames, TLS only) against a
// broker's Lumberjack listener: one `1W` at connect, then a stream of `1D` frames, seq 1, 2, ...
// Usage: node lumberjack_protocol_send.js PORT CA_PEM COUNT WINDOW [CLIENT_PEM]
// CLIENT_PEM: a client certificate and its key in one PEM file, presented to the broker
// (its login under auth = "password").
// It writes while fewer than WINDOW*10 events are unacknowledged (past that the client drops
// events, so a shipper waits for ACKs), then waits for the ACK of the last event, prints one
// JSON object on stdout ({acked, dropped, acks}) and exits; non-zero on any error or timeout.
'use strict';
var fs = require('fs');
var lumberjack = require('lumberjack-protocol');

var port = parseInt(process.argv[2], 10);
var ca = fs.readFileSync(process.argv[3]);
var count = parseInt(process.argv[4] || '1000', 10);
var windowSize = parseInt(process.argv[5] || '10', 10);
var tlsOptions = {host: '127.0.0.1', port: port, ca: [ca]};
if (process.argv[6]) {
  var pem = fs.readFileSync(process.argv[6]);
  tlsOptions.cert = pem;
  tlsOptions.key = pem;
}

var client = lumberjack.client(
  tlsOptions,
  {windowSize: windowSize, reconnect: 200, maxQueueSize: count + 1}
);
var sent = 0;
var dropped = 0;
var acks = 0;
var lastAck = 0;
var connects = 0;
var finished = false;

function finish(code, why) {
  if (finished) return;  // close() below emits 'disconnect' again
  finished = true;
  if (why) process.stderr.write('lumberjack-protocol: ' + why + '\n');
  clearTimeout(timer);
  process.stdout.write(JSON.stringify({acked: lastAck, dropped: dropped, acks: acks,
                                       connects: connects}) + '\n');
  client.close();
  process.exit(code);
}

var timer = setTimeout(function () {
  finish(3, 'timeout: ' + sent + ' sent, last ACK ' + lastAck);
}, 50000);  // under the test's own 60 s, so the test sees why

client.on('dropped', function (n) { dropped += n; });
client.on('disconnect', function (err) {
  // A disconnect after the first connect loses the window's sequence: fail loudly.
  if (connects > 0) finish(2, 'disconnected: ' + (err && err.message || 'end'));
});

function pump() {
  var socket = client._socket;
  // The library drops (not queues) an event written past WINDOW*10 unacknowledged ones.
  while (sent < count && socket && sent + 1 - lastAck <= windowSize * 10) {
    sent += 1;
    client.writeDataFrame({line: 'line ' + sent, n: String(sent), type: 'nodelog',
                           file: '/var/log/app.log', offset: String(sent * 100)});
  }
}

client.on('connect', function () {
  connects += 1;
  client._socket.on('ack', function (seq) {
    acks += 1;
    lastAck = seq;
    if (lastAck >= count) finish(0);
    else pump();
  });
  pump();
});
