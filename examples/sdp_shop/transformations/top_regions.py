from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession

spark = SparkSession.active()


# trickle reads this file without running it: a function whose body is `return spark.sql("...")` becomes a
# stream table of that query.
@dp.materialized_view(table_properties={"trickle.refresh_mode": "DIFFERENTIAL", "trickle.schedule": "30s"})
def top_regions() -> DataFrame:
    """Regions with more than 100 in paid orders."""
    return spark.sql("SELECT region, total, orders FROM region_totals WHERE total > 100")
