'use strict';
// An ali-ons push consumer that starts from a time (CONSUME_FROM_TIMESTAMP),
// for tests/replay/test_js_client.py. Usage:
//   node consume_from_time.js NAMESRV TOPIC GROUP YYYYMMDDHHMMSS COUNT
// prints one JSON line per message received, then {"done": n} once COUNT
// messages came (or {"timeout": n} after 20 s). ali-ons reads the time in
// the local zone: run it with TZ=UTC.
const { Consumer } = require('ali-ons');

const [ nameSrv, topic, group, timestamp, count ] = process.argv.slice(2);
const want = Number(count);
const quiet = { info() {}, debug() {}, warn: console.error, error: console.error };
const consumer = new Consumer({
  nameSrv,
  // only asked for name server addresses when nameSrv is not given
  httpclient: { request() { throw new Error('nameSrv is given: no address server'); } },
  consumerGroup: group,
  consumeFromWhere: 'CONSUME_FROM_TIMESTAMP',
  consumeTimestamp: timestamp,
  logger: quiet,
  rebalanceInterval: 1000,
  instanceName: `replay-test-${process.pid}`,
});
let seen = 0;

function finish(line) {
  console.log(JSON.stringify(line));
  consumer.close().finally(() => process.exit(0));
}

consumer.on('error', err => console.error(`consumer error: ${err.message}`));
consumer.subscribe(topic, '*', async msg => {
  console.log(JSON.stringify({
    topic: msg.topic, queueId: msg.queueId, queueOffset: Number(msg.queueOffset), msgId: msg.msgId,
    storeTimestamp: Number(msg.storeTimestamp), tags: msg.tags, body: msg.body.toString('base64'),
  }));
  seen += 1;
  if (seen === want) finish({ done: seen });
});
setTimeout(() => finish({ timeout: seen }), 20000).unref();
consumer.ready().catch(err => { console.error(`not ready: ${err.message}`); process.exit(3); });
