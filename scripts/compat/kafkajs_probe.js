// kafkajs (an independent, pure-JavaScript client) against a broker: admin, produce
// (plain, gzip, idempotent), a consumer group, transactions (commit + abort).
// usage: node kafkajs_probe.js HOST:PORT   (scripts/compat.sh runs it)
const { Kafka, CompressionTypes, logLevel } = require('kafkajs');
const bs = process.argv[2] || '127.0.0.1:19092';
const kafka = new Kafka({ clientId: 'compat', brokers: [bs], logLevel: logLevel.WARN });
const t = 'kjs-' + Math.random().toString(16).slice(2, 8);
(async () => {
  const admin = kafka.admin(); await admin.connect();
  await admin.createTopics({ topics: [{ topic: t, numPartitions: 3 }], waitForLeaders: true });
  const md = await admin.fetchTopicMetadata({ topics: [t] });
  console.log('created', t, md.topics[0].partitions.length, 'partitions');
  for (const [name, opts, comp] of [['plain', {}, CompressionTypes.None], ['gzip', {}, CompressionTypes.GZIP], ['idempotent', { idempotent: true, maxInFlightRequests: 1 }, CompressionTypes.None]]) {
    const p = kafka.producer(opts); await p.connect();
    const msgs = Array.from({ length: 300 }, (_, i) => ({ key: 'k' + i, value: 'v' + i }));
    const r = await p.send({ topic: t, messages: msgs, acks: -1, compression: comp });
    console.log(name, 'ok', r.map(x => `${x.partition}:${x.baseOffset}`).join(' '));
    await p.disconnect();
  }
  const c = kafka.consumer({ groupId: 'g-' + t }); await c.connect();
  await c.subscribe({ topic: t, fromBeginning: true });
  let n = 0;
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('timeout, got ' + n)), 30000);
    c.run({ eachMessage: async () => { n++; if (n === 900) { clearTimeout(timer); resolve(); } } });
  });
  console.log('consumed', n); await c.disconnect();
  const off = await admin.fetchOffsets({ groupId: 'g-' + t, topics: [t] });
  console.log('committed', JSON.stringify(off[0].partitions.map(p => p.offset)));
  const tt = t + '-tx';
  await admin.createTopics({ topics: [{ topic: tt, numPartitions: 1 }], waitForLeaders: true });
  const tp = kafka.producer({ transactionalId: 'tx-' + tt, idempotent: true, maxInFlightRequests: 1 });
  await tp.connect();
  for (const [prefix, count, commit] of [['c', 3, true], ['a', 3, false], ['d', 2, true]]) {
    const tx = await tp.transaction();
    await tx.send({ topic: tt, messages: Array.from({ length: count }, (_, i) => ({ value: prefix + i })), acks: -1 });
    if (commit) await tx.commit(); else await tx.abort();
  }
  await tp.disconnect();
  for (const readUncommitted of [true, false]) {
    const rc = kafka.consumer({ groupId: 'r-' + readUncommitted + tt, readUncommitted }); await rc.connect();
    await rc.subscribe({ topic: tt, fromBeginning: true });
    const got = [];
    rc.run({ eachMessage: async ({ message }) => { got.push(message.value.toString() + '@' + message.offset); } });
    await new Promise(r => setTimeout(r, 6000));
    console.log(readUncommitted ? 'read_uncommitted' : 'read_committed', got.join(' '));
    await rc.disconnect();
  }
  await admin.disconnect();
  console.log('DONE');
})().catch(e => { console.error('FAILED', e); process.exit(1); });
