// kafkajs's admin, producer and consumer against a tessera broker:
//   node admin_roundtrip.js HOST:PORT[,HOST:PORT...] TOPIC
// Exits 0 when every call succeeded and every check held (issue 8: kafkajs's
// admin used to stop at the first call).
const assert = require('assert');
const { Kafka, logLevel } = require('kafkajs');

const [bootstrap, topic] = process.argv.slice(2);
const group = `${topic}-group`;

(async () => {
  const kafka = new Kafka({ clientId: 'compat', brokers: bootstrap.split(','), logLevel: logLevel.ERROR });
  const admin = kafka.admin();
  await admin.connect();
  assert.strictEqual(await admin.createTopics({ topics: [{ topic, numPartitions: 2 }] }), true);
  await admin.createPartitions({ topicPartitions: [{ topic, count: 3 }] });
  const meta = await admin.fetchTopicMetadata({ topics: [topic] });
  assert.strictEqual(meta.topics[0].partitions.length, 3);

  const described = await admin.describeConfigs({ resources: [{ type: 2, name: topic }], includeSynonyms: false });
  const retention = described.resources[0].configEntries.find((e) => e.configName === 'retention.ms');
  assert.ok(retention, 'retention.ms described');
  await admin.alterConfigs({
    resources: [{ type: 2, name: topic, configEntries: [{ name: 'retention.ms', value: '100000' }] }],
  });
  const altered = await admin.describeConfigs({ resources: [{ type: 2, name: topic }], includeSynonyms: false });
  assert.strictEqual(
    altered.resources[0].configEntries.find((e) => e.configName === 'retention.ms').configValue,
    '100000',
  );

  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  await producer.send({
    topic,
    messages: Array.from({ length: 30 }, (_, i) => ({ value: `v${i}`, partition: i % 3 })),
  });
  await producer.disconnect();
  const offsets = await admin.fetchTopicOffsets(topic);
  assert.deepStrictEqual(offsets.map((o) => o.high), ['10', '10', '10']);

  await admin.deleteTopicRecords({ topic, partitions: [{ partition: 0, offset: '2' }] });
  const trimmed = await admin.fetchTopicOffsets(topic);
  assert.strictEqual(trimmed.find((o) => o.partition === 0).low, '2');

  const consumer = kafka.consumer({ groupId: group });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const seen = new Set();
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`consumed only ${seen.size}`)), 60000);
    consumer
      .run({
        eachMessage: async ({ message }) => {
          seen.add(message.value.toString());
          if (seen.size === 28) {
            clearTimeout(timer);
            resolve();
          }
        },
      })
      .catch(reject);
  });
  await consumer.disconnect();

  const committed = await admin.fetchOffsets({ groupId: group, topics: [topic] });
  assert.deepStrictEqual(
    committed[0].partitions.map((p) => p.offset).sort(),
    ['10', '10', '10'],
  );
  const groups = await admin.describeGroups([group]);
  assert.strictEqual(groups.groups[0].state, 'Empty');
  const cluster = await admin.describeCluster();
  assert.ok(cluster.brokers.length >= 1 && cluster.controller !== null);
  await admin.deleteGroups([group]);
  await admin.deleteTopics({ topics: [topic] });
  assert.ok(!(await admin.listTopics()).includes(topic));
  await admin.disconnect();
  console.log('kafkajs admin roundtrip ok');
})().catch((e) => {
  console.error('FAILED', e);
  process.exit(1);
});
