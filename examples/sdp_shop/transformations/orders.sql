-- Paid orders only. A temporary view: trickle inlines it into the materialized views that read it.
CREATE TEMPORARY VIEW paid_orders AS
SELECT id, customer_id, amount FROM shop_orders WHERE status = 'paid';

-- Per customer: a join and an aggregate. The table properties set trickle's refresh mode and schedule.
CREATE MATERIALIZED VIEW customer_totals
  TBLPROPERTIES ('trickle.refresh_mode' = 'DIFFERENTIAL', 'trickle.schedule' = '30s')
AS SELECT c.region, c.id AS customer_id, SUM(p.amount) AS total, COUNT(*) AS orders
   FROM paid_orders p JOIN shop_customers c ON p.customer_id = c.id
   GROUP BY c.region, c.id;

-- Per region, over the one above. The same settings can go in the comment instead; CALCULATED refreshes
-- it as often as the tables that read it need.
CREATE MATERIALIZED VIEW region_totals
  COMMENT 'Paid sales per region. trickle.refresh_mode=DIFFERENTIAL trickle.schedule=CALCULATED'
AS SELECT region, SUM(total) AS total, SUM(orders) AS orders, COUNT(*) AS customers
   FROM customer_totals
   GROUP BY region;
